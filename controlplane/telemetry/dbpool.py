"""Database calls of the agent consumer on a small pool of threads of their own.

Channels' ``database_sync_to_async`` runs every call on ONE thread per process
(thread-sensitive), so 300 agents connecting at once queued their hellos behind each other
(issue 20, defect 9: 28.7 s until the last welcome). A hello touches only its own node's
rows, so hellos can run side by side; the pool is bounded (``TELEMETRY_DB_THREADS``, default
8) so a storm cannot take more PostgreSQL connections than that.

Each thread keeps its Django connection while work is queued and closes it when the pool
goes idle, so a quiet server holds no connections and tests can drop their database.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async
from django.conf import settings

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_busy = 0  # calls queued or running


def pool_size() -> int:
    return int(getattr(settings, "TELEMETRY_DB_THREADS", None)
               or os.environ.get("PDPLANE_TELEMETRY_DB_THREADS", 8))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(pool_size(), thread_name_prefix="agent-db")
        return _pool


_opened: set = set()  # Django connection wrappers of the pool's threads


def _run_then_maybe_close(fn, args, kwargs):
    global _busy
    from django.db import connections

    try:
        return fn(*args, **kwargs)
    finally:
        with _lock:
            _opened.update(connections.all(initialized_only=True))
            _busy -= 1
            if _busy == 0:  # idle: no call can start before the lock is released
                _close_opened()


def _close_opened() -> None:
    for conn in _opened:
        conn.inc_thread_sharing()  # closed from whichever pool thread went idle last
        try:
            conn.close()
        finally:
            conn.dec_thread_sharing()
    _opened.clear()


async def run(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on the consumer's database pool (with Channels' stale
    connection handling around it)."""
    global _busy
    with _lock:
        _busy += 1
    call = database_sync_to_async(_run_then_maybe_close, thread_sensitive=False,
                                  executor=_executor())
    return await call(fn, args, kwargs)
