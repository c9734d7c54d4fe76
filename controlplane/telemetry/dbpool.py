"""Database calls of the agent consumer on small pools of threads of their own.

Channels' ``database_sync_to_async`` runs every call on ONE thread per process
(thread-sensitive), so 300 agents connecting at once queued their hellos behind each other
(issue 20, defect 9: 28.7 s until the last welcome). A hello touches only its own node's
rows, so hellos can run side by side. Two bounded pools keep the quick calls (token lookup,
the reads a welcome needs, commands) from queueing behind the heavy ones (inventory
reconciles): ``TELEMETRY_DB_THREADS`` (default 8) and ``TELEMETRY_DB_BULK_THREADS`` (4),
so a storm takes at most that many PostgreSQL connections.

Each thread keeps its Django connection while its pool has work queued, and the pool closes
them when it goes idle: a quiet server holds no connections, and tests can drop their
database.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async
from django.conf import settings


class _Call:
    """Whether one call reached its thread (under its pool's lock)."""

    __slots__ = ("abandoned", "started")

    def __init__(self):
        self.started = self.abandoned = False


class _Pool:
    def __init__(self, setting: str, env: str, default: int, name: str):
        self.setting, self.env, self.default, self.name = setting, env, default, name
        self.lock = threading.Lock()
        self.executor: ThreadPoolExecutor | None = None
        self.busy = 0  # calls queued or running
        self.opened: set = set()  # Django connection wrappers of this pool's threads

    def size(self) -> int:
        return int(getattr(settings, self.setting, None) or os.environ.get(self.env)
                   or self.default)

    def _executor(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(self.size(), thread_name_prefix=self.name)
            return self.executor

    def _call(self, call, fn, args, kwargs):
        from django.db import connections

        with self.lock:
            if call.abandoned:  # its caller was cancelled and has already let go of it
                return None
            call.started = True
        try:
            return fn(*args, **kwargs)
        finally:
            with self.lock:
                self.opened.update(connections.all(initialized_only=True))
                self._release()

    def _release(self) -> None:
        """One call fewer queued or running (the caller holds the lock)."""
        self.busy -= 1
        if self.busy == 0:  # idle: no call can start before the lock is released
            self._close_opened()

    def _close_opened(self) -> None:
        for conn in self.opened:
            conn.inc_thread_sharing()  # closed from whichever thread went idle last
            try:
                conn.close()
            finally:
                conn.dec_thread_sharing()
        self.opened.clear()

    async def run(self, fn, *args, **kwargs):
        with self.lock:
            self.busy += 1
        call = _Call()
        wrapped = database_sync_to_async(self._call, thread_sensitive=False,
                                         executor=self._executor())
        try:
            return await wrapped(call, fn, args, kwargs)
        finally:
            # A caller cancelled while its call waited for a thread (a connection closed
            # during a hello storm, a server shutting down) takes the call out of the
            # queue, and _call never runs: without this the pool stayed busy forever and
            # never closed its threads' connections (a test database could not be dropped).
            with self.lock:
                if not call.started:
                    call.abandoned = True
                    self._release()


_quick = _Pool("TELEMETRY_DB_THREADS", "PDPLANE_TELEMETRY_DB_THREADS", 8, "agent-db")
_bulk = _Pool("TELEMETRY_DB_BULK_THREADS", "PDPLANE_TELEMETRY_DB_BULK_THREADS", 4,
              "agent-db-bulk")


async def run(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the quick pool (with Channels' stale-connection handling)."""
    return await _quick.run(fn, *args, **kwargs)


async def run_bulk(fn, *args, **kwargs):
    """As :func:`run`, on the pool for heavy work (inventory reconciles)."""
    return await _bulk.run(fn, *args, **kwargs)
