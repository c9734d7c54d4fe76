"""The agent consumer's DB thread pools go idle (and close their connections) even when a
caller is cancelled while its call still waits for a thread."""

import asyncio
import threading

from controlplane.telemetry import dbpool


def test_a_call_cancelled_in_the_queue_does_not_keep_the_pool_busy():
    pool = dbpool._Pool("UNSET_TEST_SETTING", "PDPLANE_UNSET_TEST_ENV", 1, "test-db")
    release = threading.Event()
    ran = []

    async def scenario():
        first = asyncio.ensure_future(pool.run(release.wait))
        queued = asyncio.ensure_future(pool.run(ran.append, "queued"))
        # Until both are submitted (the first holds the pool's one thread).
        while pool.busy < 2:
            await asyncio.sleep(0.01)
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        assert pool.busy == 1  # the cancelled call let go of its place
        release.set()
        assert await first is True

    asyncio.run(scenario())
    pool.executor.shutdown(wait=True)
    assert pool.busy == 0 and not pool.opened  # idle: connections closed
    assert ran == []  # the cancelled call never ran
