"""Shared by the tests that drive the live dashboard consumer with a WebsocketCommunicator."""

from __future__ import annotations

import asyncio

# How long such a test waits for a message it expects: the suite's one bound (tests/conftest.py).
from tests.conftest import WAIT_S

__all__ = ["WAIT_S", "beyond_status", "is_status_only", "next_update"]


def is_status_only(html: str) -> bool:
    """The consumer's "still live" heartbeat (every REFRESH_S with nothing new), alone."""
    return html.startswith('<span id="live-status"') and html.count('hx-swap-oob="true"') == 1


async def beyond_status(communicator, seconds: float) -> list[str]:
    """The messages that arrive within ``seconds``, heartbeats left out: a negative check's
    window. A heartbeat is due REFRESH_S after the last message, and on a starved box that
    moment can fall inside the window."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    got = []
    while (left := end - loop.time()) > 0:
        if await communicator.receive_nothing(timeout=left):
            break
        html = await communicator.receive_from(timeout=WAIT_S)
        if not is_status_only(html):
            got.append(html)
    return got


async def next_update(communicator) -> str:
    """The next message that is more than a heartbeat (one may come first: it is due
    REFRESH_S after the last message, and a starved box can take that long to send a hint)."""
    while is_status_only(html := await communicator.receive_from(timeout=WAIT_S)):
        pass
    return html
