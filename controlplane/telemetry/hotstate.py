"""Hot state: the latest telemetry per node/GPU/engine/NIC in Redis, and its read API.

Writes go through ONE :class:`HotStateWriter` per process and event loop: every report's
commands join a batch that is sent as one pipeline ~2 ms after the first item arrives, or
as soon as the previous flush returns (reference/MEASURED.md: pipelined writes are ~3×
cheaper than one awaited call per report). The writer also coalesces which nodes changed
and fans out at most one ``telemetry.changed`` message per cluster per second to the
``live.cluster.<id>`` group — never a channel-layer send per report.

Key layout (prefix ``P`` = settings.TELEMETRY_REDIS_PREFIX, default ``pdp:tm:``; see
docs/agent-protocol.md, "Hot state"):

- ``P c:<cluster>`` hash: field ``n:<node>`` → node JSON, ``w:<worker>`` → worker JSON
- ``P idx`` hash: ``n:<node>`` / ``w:<worker>`` → cluster id (written on hello)
- ``P seen`` sorted set: node id scored by the time its last report was received
- ``P h:n:<node>`` / ``P h:w:<worker>`` lists: history ring (one point per ~10 s, 90 points)
- ``P gen:<node>`` counter: connection generation; ``P live:<node>`` hash: gen, channel,
  connected_at, disconnected_at of the current connection
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict

import orjson
import redis
import redis.asyncio as aioredis
from django.conf import settings

log = logging.getLogger(__name__)

HISTORY_STEP_S = 10.0
HISTORY_POINTS = 90  # 15 minutes at 10 s
FANOUT_INTERVAL_S = 1.0
BATCH_DELAY_S = 0.002
STALE_AFTER_REPORTS = 3


def prefix() -> str:
    return getattr(settings, "TELEMETRY_REDIS_PREFIX", None) or os.environ.get(
        "PDPLANE_TELEMETRY_PREFIX", "pdp:tm:"
    )


def report_interval_s() -> float:
    return float(getattr(settings, "TELEMETRY_REPORT_INTERVAL_S", None) or os.environ.get(
        "PDPLANE_REPORT_INTERVAL_S", 2.0
    ))


def live_group(cluster_id: int) -> str:
    return f"live.cluster.{cluster_id}"


class Keys:
    def __init__(self, p: str | None = None):
        self.p = p if p is not None else prefix()

    def cluster(self, cid) -> str:
        return f"{self.p}c:{cid}"

    @property
    def idx(self) -> str:
        return f"{self.p}idx"

    @property
    def seen(self) -> str:
        return f"{self.p}seen"

    def history(self, kind: str, ident) -> str:
        return f"{self.p}h:{kind}:{ident}"

    def gen(self, nid) -> str:
        return f"{self.p}gen:{nid}"

    def live(self, nid) -> str:
        return f"{self.p}live:{nid}"


# --------------------------------------------------------------------------- writer


class HotStateWriter:
    """Batches hot-state writes of every connection in this process into pipelines."""

    def __init__(self, redis_url: str, keys: Keys):
        self.keys = keys
        self.redis = aioredis.Redis.from_url(redis_url, max_connections=64)
        self._batch: list[tuple[list[tuple], asyncio.Future]] = []
        self._scheduled = False
        self._flushing = False
        self._changed: dict[int, set[int]] = defaultdict(set)
        self._history_due: dict[str, float] = {}
        self._fanout_task: asyncio.Task | None = None
        self.loop = asyncio.get_running_loop()
        self.flushes = 0
        self.commands_written = 0

    def submit(self, commands: list[tuple]) -> asyncio.Future:
        """Queue Redis commands; the future resolves once they were sent: to the list of
        their replies (an exception instance for a command Redis refused), or to None
        when Redis could not be reached."""
        fut = self.loop.create_future()
        self._batch.append((commands, fut))
        if not self._scheduled and not self._flushing:
            self._scheduled = True
            self.loop.call_later(BATCH_DELAY_S, self._start_flush)
        return fut

    def _start_flush(self) -> None:
        self._scheduled = False
        if not self._flushing:
            self._flushing = True
            self.loop.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._batch:
                batch, self._batch = self._batch, []
                pipe = self.redis.pipeline(transaction=False)
                for commands, _ in batch:
                    for cmd in commands:
                        pipe.execute_command(*cmd)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                except Exception as exc:  # Redis down: every waiter learns it, nobody crashes
                    log.warning("hot-state flush failed: %s", exc)
                    replies = None
                self.flushes += 1
                self.commands_written += sum(len(c) for c, _ in batch)
                at = 0
                for commands, fut in batch:
                    if not fut.done():
                        fut.set_result(None if replies is None
                                       else replies[at:at + len(commands)])
                    at += len(commands)
        finally:
            self._flushing = False

    def history_due(self, key: str, now: float) -> bool:
        """True at most once per HISTORY_STEP_S for ``key`` (a node or worker)."""
        due = self._history_due.get(key, 0.0)
        if now >= due:
            self._history_due[key] = now + HISTORY_STEP_S
            return True
        return False

    def mark_changed(self, cluster_id: int, node_id: int) -> None:
        self._changed[cluster_id].add(node_id)
        if self._fanout_task is None or self._fanout_task.done():
            self._fanout_task = self.loop.create_task(self._fanout_loop())

    async def _fanout_loop(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        while True:
            await asyncio.sleep(FANOUT_INTERVAL_S)
            if not self._changed:
                continue
            changed, self._changed = self._changed, defaultdict(set)
            for cid, nodes in changed.items():
                try:
                    await layer.group_send(
                        live_group(cid),
                        {"type": "telemetry.changed", "node_ids": sorted(nodes)},
                    )
                except Exception as exc:  # the fan-out is a hint; never break ingest for it
                    log.warning("live fan-out to cluster %s failed: %s", cid, exc)


_writers: dict[int, HotStateWriter] = {}


def get_writer() -> HotStateWriter:
    """The writer of the running event loop (one per process in a server)."""
    loop = asyncio.get_running_loop()
    for key in [k for k, w in _writers.items() if w.loop.is_closed()]:
        del _writers[key]  # loops of finished asyncio.run() calls (tests, scripts)
    writer = _writers.get(id(loop))
    if writer is None or writer.loop is not loop or writer.keys.p != prefix():
        writer = HotStateWriter(settings.REDIS_URL, Keys())
        _writers[id(loop)] = writer
    return writer


# --------------------------------------------------------------------------- reads

_sync_clients: dict[str, redis.Redis] = {}
_async_clients: dict[tuple[int, str], tuple[asyncio.AbstractEventLoop, aioredis.Redis]] = {}


def sync_redis() -> redis.Redis:
    url = settings.REDIS_URL
    client = _sync_clients.get(url)
    if client is None:
        client = _sync_clients[url] = redis.Redis.from_url(url)
    return client


def async_redis() -> aioredis.Redis:
    loop = asyncio.get_running_loop()
    key = (id(loop), settings.REDIS_URL)
    entry = _async_clients.get(key)
    if entry is None or entry[0] is not loop:
        for stale in [k for k, (lp, _) in _async_clients.items() if lp.is_closed()]:
            del _async_clients[stale]
        entry = _async_clients[key] = (loop, aioredis.Redis.from_url(settings.REDIS_URL))
    return entry[1]


# One round trip: look up the cluster of an entity, then read its field.
_GET_ENTITY_LUA = """
local cid = redis.call('HGET', KEYS[1], ARGV[1])
if not cid then return false end
return redis.call('HGET', ARGV[2] .. cid, ARGV[1])
"""


def _decorate(state: dict | None, now: float) -> dict | None:
    """Add ``stale`` and ``age_s`` computed at read time."""
    if state is None:
        return None
    received = state.get("received_at") or 0
    interval = state.get("interval_s") or report_interval_s()
    state["age_s"] = max(0.0, now - received)
    state["stale"] = state["age_s"] > STALE_AFTER_REPORTS * interval
    return state


def _loads(raw) -> dict | None:
    return orjson.loads(raw) if raw else None


def _entity(kind: str, ident: int) -> dict | None:
    k = Keys()
    raw = sync_redis().eval(_GET_ENTITY_LUA, 1, k.idx, f"{kind}:{ident}", f"{k.p}c:")
    return _decorate(_loads(raw), time.time())


async def _aentity(kind: str, ident: int) -> dict | None:
    k = Keys()
    raw = await async_redis().eval(_GET_ENTITY_LUA, 1, k.idx, f"{kind}:{ident}", f"{k.p}c:")
    return _decorate(_loads(raw), time.time())


def node_state(node_id: int) -> dict | None:
    """Latest state of a node: gpus, nics, engines (ids → worker ids), agent counters,
    ``last_report_at`` (= received_at, Unix s), ``stale``; None if it never reported."""
    return _entity("n", node_id)


def worker_state(worker_id: int) -> dict | None:
    """Latest state of a worker: running, waiting, kv_blocks_used/total, kv_usage,
    prefix_hit_rate, prompt/generation tokens per s, ttft/itl p50/p95 (s), role,
    generation, kv_events digest, ``last_report_at``, ``stale``; None if never reported."""
    return _entity("w", worker_id)


async def anode_state(node_id: int) -> dict | None:
    return await _aentity("n", node_id)


async def aworker_state(worker_id: int) -> dict | None:
    return await _aentity("w", worker_id)


def _split_snapshot(raw: dict, now: float) -> dict:
    nodes, workers = {}, {}
    for field, value in raw.items():
        field = field.decode() if isinstance(field, bytes) else field
        kind, _, ident = field.partition(":")
        state = _decorate(orjson.loads(value), now)
        if kind == "n":
            nodes[int(ident)] = state
        elif kind == "w":
            workers[int(ident)] = state
    return {"nodes": nodes, "workers": workers, "at": now}


def cluster_snapshot(cluster_id: int) -> dict:
    """Everything live in a cluster in one round trip: {"nodes": {id: state},
    "workers": {id: state}, "at": unix time}."""
    raw = sync_redis().hgetall(Keys().cluster(cluster_id))
    return _split_snapshot(raw, time.time())


async def acluster_snapshot(cluster_id: int) -> dict:
    raw = await async_redis().hgetall(Keys().cluster(cluster_id))
    return _split_snapshot(raw, time.time())


NODE_METRICS = ("gpu_utilization", "gpu_memory_used_bytes", "power_w", "nic_tx_gbps",
                "nic_rx_gbps")
WORKER_METRICS = ("running", "waiting", "kv_usage", "prefix_hit_rate", "prompt_tokens_per_s",
                  "generation_tokens_per_s", "ttft_p95_s", "itl_p95_s")


def _history_key(node_id, worker_id) -> str:
    if (node_id is None) == (worker_id is None):
        raise ValueError("give exactly one of node_id or worker_id")
    return Keys().history("n" if node_id is not None else "w", node_id or worker_id)


def history(metric: str, *, node_id: int | None = None, worker_id: int | None = None
            ) -> list[tuple[float, float | None]]:
    """Sparkline points (unix time, value), oldest first, up to 15 min at ~10 s steps.

    Node metrics: NODE_METRICS; worker metrics: WORKER_METRICS.
    """
    raw = sync_redis().lrange(_history_key(node_id, worker_id), 0, -1)
    return [(p["t"], p.get(metric)) for p in map(orjson.loads, raw)]


async def ahistory(metric: str, *, node_id: int | None = None, worker_id: int | None = None
                   ) -> list[tuple[float, float | None]]:
    raw = await async_redis().lrange(_history_key(node_id, worker_id), 0, -1)
    return [(p["t"], p.get(metric)) for p in map(orjson.loads, raw)]


def last_seen_all() -> dict[int, float]:
    """node id → unix time of its last received report."""
    raw = sync_redis().zrange(Keys().seen, 0, -1, withscores=True)
    return {int(member): score for member, score in raw}


def live_connection(node_id: int) -> dict:
    """The node's current connection marker: gen, channel, connected_at, disconnected_at."""
    raw = sync_redis().hgetall(Keys().live(node_id))
    return {k.decode(): v.decode() for k, v in raw.items()}


# Lua: claim the node's live marker for a new connection; returns the previous channel.
_CLAIM_LUA = """
local old = redis.call('HGET', KEYS[1], 'channel')
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'channel', ARGV[2], 'connected_at', ARGV[3])
redis.call('HDEL', KEYS[1], 'disconnected_at')
return old
"""
# Lua: release it only if this connection's generation is still the current one.
_RELEASE_LUA = """
if redis.call('HGET', KEYS[1], 'gen') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'channel')
  redis.call('HSET', KEYS[1], 'disconnected_at', ARGV[2])
  return 1
end
return 0
"""


async def claim_live(node_id: int, gen: int, channel: str) -> str | None:
    """Make connection ``gen`` (channel-layer name ``channel``) the node's current one;
    returns the channel of the connection it takes over from, if it had one."""
    old = await async_redis().eval(_CLAIM_LUA, 1, Keys().live(node_id), gen, channel,
                                   time.time())
    return old.decode() if old else None


async def release_live(node_id: int, gen: int) -> bool:
    """Mark the node's connection closed, if connection ``gen`` is still its current one
    (a late disconnect of an older socket changes nothing)."""
    return bool(await async_redis().eval(_RELEASE_LUA, 1, Keys().live(node_id), gen,
                                         time.time()))
