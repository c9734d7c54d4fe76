"""The one KV-event stream module: the pure sequence rules (hypothesis for the invariants),
then both drivers (agent thread, gateway asyncio) against the simulator's real ZMQ
publisher: engine restart → that worker's blocks dropped and refilled; one stray frame
with a huge sequence number → recovered; silence after work was sent → stalled, reported."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kv_subscriber import KvEventSubscriber
from gateway.metrics import GatewayMetrics
from gateway.prefix_index import PreciseIndex
from gateway.statictable import static_table
from gateway.table import parse
from tests.conftest import WAIT_S, free_ports
from workers_agent.collectors.kv_events import KVEventSubscriber
from workers_agent.kvstream import BlockStored, KvStream, decode_batch
from workers_agent.sim.kvevents import KvEventPublisher


class ListSink:
    def __init__(self):
        self.events, self.resets = [], 0

    def apply(self, events):
        self.events.extend(events)

    def reset(self):
        self.resets += 1
        self.events.clear()


def payload(*hashes):
    return msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": list(hashes),
                                 "parent_block_hash": None, "token_ids": [], "block_size": 16,
                                 "medium": "GPU"}], 0])


def held(sink):
    return [h for e in sink.events if isinstance(e, BlockStored) for h in e.block_hashes]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_in_order_gap_replay_and_duplicates():
    sink = ListSink()
    s = KvStream(sink)
    assert s.receive(0, payload(0)) is None
    want = s.receive(3, payload(3))
    assert (want.start, want.stop) == (1, 3)
    assert s.replayed(1, payload(1)) and s.replayed(2, payload(2))
    assert not s.replayed(3, payload(3))  # outside the asked range
    s.replay_done(answered=True)
    assert held(sink) == [0, 1, 2, 3] and s.lost == 0 and s.gaps == 1 and s.complete
    # A tail replay runs ahead of the live stream; those batches arriving live are
    # duplicates, not a restart.
    s._last_frame_at = -100.0
    s._tail_checked = False
    tail = s.due_replay()
    assert (tail.start, tail.verify) == (3, 3)
    assert not s.replayed(3, payload(3))  # the batch we hold: the same engine
    assert s.replayed(4, payload(4)) and s.replayed(5, payload(5))
    assert s.replay_done(answered=True) is None
    assert s.receive(4, payload(4)) is None and s.receive(5, payload(5)) is None
    assert s.duplicates == 2 and s.restarts == 0 and held(sink) == [0, 1, 2, 3, 4, 5]


def test_restart_drops_blocks_and_follows_the_new_stream():
    sink = ListSink()
    s = KvStream(sink, can_replay=False)
    for i in range(5):
        s.receive(i, payload(i))
    s.receive(0, payload(100))  # the engine restarted
    assert sink.resets == 1 and held(sink) == [100] and s.restarts == 1 and s.last_seq == 0
    # Restart seen late (seq 0..1 missed): still a restart, with a replay from 0.
    s2 = KvStream(ListSink())
    for i in range(5):
        s2.receive(i, payload(i))
    want = s2.receive(2, payload(202))
    assert s2.restarts == 1 and (want.start, want.stop) == (0, 2)


def test_one_stray_huge_sequence_is_ignored():
    sink = ListSink()
    s = KvStream(sink, can_replay=False, max_jump=1000)
    s.receive(0, payload(0))
    assert s.receive(2**62, payload(666)) is None
    s.receive(1, payload(1))
    s.receive(2, payload(2))
    assert held(sink) == [0, 1, 2] and s.strays == 1 and s.last_seq == 2 and s.restarts == 0


def test_a_confirmed_jump_starts_over():
    sink = ListSink()
    s = KvStream(sink, can_replay=False, max_jump=1000)
    s.receive(0, payload(0))
    s.receive(50_000, payload(5))
    s.receive(50_001, payload(6))
    assert held(sink) == [5, 6] and s.jumps == 1 and sink.resets == 1 and s.last_seq == 50_001


def test_stall_after_expected_work_and_unanswered_probe():
    clock = Clock()
    s = KvStream(ListSink(), stall_after_s=5, tail_check_s=1, probe_interval_s=3, clock=clock)
    s.receive(0, payload(0))
    s.expect_events()
    clock.t = 4.9
    assert not s.check_stall()
    clock.t = 5.0
    assert s.check_stall() and "no KV events" in s.stall_reason and s.stalls == 1
    s.receive(1, payload(1))  # events are back
    assert not s.stalled
    clock.t = 7.0
    tail = s.due_replay()
    assert tail is not None and tail.start == 1 and tail.stop is None
    s.replayed(1, payload(1))
    assert s.replay_done(answered=True) is None
    clock.t = 10.0
    probe = s.due_replay()
    assert probe is not None and probe.probe
    s.replay_done(answered=False)
    assert s.stalled and "replay socket" in s.stall_reason


def test_a_probe_sees_a_restart_that_the_live_stream_missed():
    """The engine restarted while we were not connected and published less than we had
    seen: its replay buffer lacks our last batch, so the probe starts over from 0."""
    clock = Clock()
    sink = ListSink()
    s = KvStream(sink, tail_check_s=1, clock=clock)
    for i in range(6):
        s.receive(i, payload(i))
    clock.t = 2.0
    probe = s.due_replay()
    assert probe.verify == 5
    for i in range(3):  # the new engine's buffer: seq 0..2 only
        s.replayed(i, payload(100 + i))
    again = s.replay_done(answered=True)
    assert s.restarts == 1 and sink.resets == 1 and (again.start, again.stop) == (0, None)
    for i in range(3):
        assert s.replayed(i, payload(100 + i))
    assert s.replay_done(answered=True) is None
    assert held(sink) == [100, 101, 102] and s.last_seq == 2
    s.receive(3, payload(103))
    assert held(sink)[-1] == 103 and s.restarts == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 40), st.just(2**62), st.integers(-5, -1)),
                max_size=60))
def test_any_sequence_never_crashes_and_recovers(seqs):
    """Whatever arrives, a following in-order stream from 0 is applied in full."""
    sink = ListSink()
    s = KvStream(sink, can_replay=False, max_jump=1000)
    for seq in seqs:
        s.receive(seq, payload(seq))
    for i in range(3):  # a fresh engine
        s.receive(i, payload(1000 + i))
    s.receive(3, payload(1003))
    assert held(sink)[-4:] == [1000, 1001, 1002, 1003] and s.last_seq == 3


def test_decode_batch_counts_unknown_events():
    raw = msgpack.packb({"ts": 1.0, "events": [{"type": "New"}, ["BlockRemoved", [1], "CPU"],
                                               42]})
    batch = decode_batch(raw)
    assert batch.unknown == 2 and batch.events[0].medium == "CPU" and batch.ts == 1.0


# --- drivers against the simulator's ZMQ publisher -------------------------------------


def stored_event(*hashes, tokens=()):
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
            "token_ids": list(tokens), "block_size": 4, "lora_id": None, "medium": "GPU"}


async def started_publisher(pub_port, replay_port):
    """A publisher on these ports; ZMQ releases a closed socket's port a moment later."""
    import zmq

    for _ in range(50):
        pub = KvEventPublisher(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
        try:
            await pub.start()
            return pub
        except zmq.ZMQError:
            await pub.close()
            await asyncio.sleep(0.1)
    raise RuntimeError("ports stayed busy")


async def until(pred, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.timeout(60)
def test_gateway_subscriber_restart_stray_and_stall_with_real_zmq():
    asyncio.run(_gateway_scenario())


async def _gateway_scenario():
    pub_port, replay_port = free_ports(2)
    pub = await started_publisher(pub_port, replay_port)
    index = PreciseIndex()
    metrics = GatewayMetrics()
    resets = []

    def on_reset(model, worker):
        resets.append(worker)
        index.forget_worker(worker)

    sub = KvEventSubscriber(lambda m, w, ev: index.apply(w, ev), metrics, on_reset=on_reset,
                            stall_after_s=0.6, tail_check_s=0.2, probe_interval_s=0.5,
                            replay_timeout_s=0.5)
    table = parse(static_table("m", [{"url": "http://127.0.0.1:1", "id": "w1",
                                      "kv_events_endpoint": f"tcp://127.0.0.1:{pub_port}",
                                      "kv_replay_endpoint": f"tcp://127.0.0.1:{replay_port}"}]))
    sub.sync(table)
    try:
        await asyncio.sleep(0.4)  # slow joiner
        a, b = list(range(8)), list(range(100, 108))
        await pub.publish([stored_event(1, 2, tokens=a)])
        assert await until(lambda: index.match(a).get("w1") == 8)
        stream = sub.streams["w1"]

        # Engine restart: a new publisher on the same ports numbers from 0 again.
        await pub.close()
        pub = await started_publisher(pub_port, replay_port)
        await asyncio.sleep(0.4)
        await pub.publish([stored_event(7, 8, tokens=b)])
        assert await until(lambda: stream.restarts == 1), stream.stats()
        assert resets == ["w1"]
        assert index.match(a) == {}  # the old engine's blocks are gone ...
        assert await until(lambda: index.match(b).get("w1") == 8)  # ... the new ones in

        # One stray frame with a huge sequence number, then the stream goes on.
        await pub._pub.send_multipart([b"kv-events", (2**62).to_bytes(8, "big"),
                                       msgpack.packb([0, [stored_event(66, tokens=a)], 0])])
        c = list(range(200, 204))
        await pub.publish([stored_event(9, tokens=c)])
        assert await until(lambda: index.match(c).get("w1") == 4), stream.stats()
        assert stream.strays == 1 and stream.last_seq == 1 and index.match(a) == {}

        # Stall: work was sent, nothing comes → stalled, in /metrics; events clear it.
        sub.expect_events("w1")
        assert await until(lambda: sub.stalled("w1"))
        from prometheus_client import generate_latest

        text = generate_latest(metrics.registry).decode()
        assert 'pdplane_gateway_kv_stream_stalled{reason="no KV events 0.6s after work was ' \
               'sent",worker="w1"} 1.0' in text
        assert 'pdplane_gateway_kv_stream_restarts_total{worker="w1"} 1.0' in text
        await pub.publish([stored_event(10, tokens=list(range(300, 304)))])
        assert await until(lambda: not sub.stalled("w1"))
    finally:
        await sub.close()
        await pub.close()


@pytest.mark.timeout(60)
def test_agent_subscriber_survives_a_stray_huge_sequence_and_reports_stalls():
    """Issue 20, defect 4: one stray frame used to freeze the agent's subscriber."""
    asyncio.run(_agent_scenario())


async def _agent_scenario():
    pub_port, replay_port = free_ports(2)
    pub = await started_publisher(pub_port, replay_port)
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}",
                            tail_check_s=0.2, probe_interval_s=0.4, replay_timeout_s=0.3)
    sub.start()
    try:
        await asyncio.sleep(0.4)
        await pub.publish([stored_event(1)])
        assert await until(lambda: sub.block_count == 1)
        await pub._pub.send_multipart([b"kv-events", (2**62).to_bytes(8, "big"),
                                       msgpack.packb([0, [stored_event(2)], 0])])
        for i in range(3, 6):
            await pub.publish([stored_event(i)])
        assert await until(lambda: sub.block_count == 4), sub.stats()
        stats = sub.stats()
        assert stats["last_seq"] == 3 and stats["strays"] == 1 and not stats["stalled"]
        await pub.close()  # the engine is gone: the probe of the replay socket goes unanswered
        assert await until(lambda: sub.stats()["stalled"]), sub.stats()
    finally:
        sub.stop()
        await pub.close()


def test_a_stalled_worker_is_routed_on_the_approximate_index_only():
    """The gateway ignores a stalled worker's precise entries (they may be stale)."""
    from gateway.app import create_app
    from gateway.config import GatewayConfig

    gateway, _ = create_app(GatewayConfig(kv_events=False))
    assert gateway.store.apply(static_table("m", [{"url": "http://a:1", "id": "a"},
                                                  {"url": "http://b:1", "id": "b"}]))
    model = gateway.store.current.models["m"]
    tokens = list(range(64))
    index = gateway.precise.setdefault("m", PreciseIndex())
    index.apply("a", [BlockStored((1, 2, 3, 4), None, tuple(tokens), 16)])
    gateway.subscriber = KvEventSubscriber(lambda *a: None)
    stream = gateway.subscriber.streams["a"] = KvStream(ListSink())
    view = asyncio.run(gateway._prompt_view(model, {"prompt": tokens}, chat=False))
    assert view["cached"].get("a") == 64
    stream._stall("test")
    view = asyncio.run(gateway._prompt_view(model, {"prompt": tokens}, chat=False))
    assert "a" not in view["cached"]
