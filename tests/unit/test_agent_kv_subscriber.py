"""KVEventSubscriber against a small ZMQ publisher on loopback: gaps, replay, lost tail,
publisher restart, both batch encodings."""

import threading
import time

import msgpack
import pytest
import zmq

from tests.conftest import WAIT_S, free_port
from workers_agent.collectors.kv_events import KVEventSubscriber

END = (-1).to_bytes(8, "big", signed=True)


class Publisher:
    """vLLM-like: PUB with [topic, seq, payload]; ROUTER replay answering from a buffer.
    An XPUB, so a test can wait for a subscriber to have joined."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub_port = free_port()
        self.pub.bind(f"tcp://127.0.0.1:{self.pub_port}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.replay_port = free_port()
        self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.buffer: list[tuple[int, bytes]] = []
        self.seq = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            start = int.from_bytes(start, "big")
            with self.lock:
                batches = [b for b in self.buffer if b[0] >= start]
            for seq, payload in batches:
                self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([ident, b"", END, b""])

    def publish(self, events, *, drop=False, fmt="array"):
        batch = [time.time(), events, 0] if fmt == "array" else {
            "ts": time.time(), "events": events, "data_parallel_rank": 0}
        payload = msgpack.packb(batch)
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        if not drop:
            self.pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])

    def wait_subscribed(self) -> None:
        """Until a subscription has reached this socket: what is published from then on
        is delivered (PUB/SUB joins asynchronously, the "slow joiner")."""
        assert self.pub.poll(WAIT_S * 1000), "no subscriber joined"
        assert self.pub.recv()[:1] == b"\x01"

    def restart(self):
        with self.lock:
            self.seq = 0
            self.buffer = []

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.pub.close(0)
        self.router.close(0)
        self.ctx.term()


def stored(*hashes):
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
            "token_ids": [], "block_size": 16, "lora_id": None, "medium": "GPU"}


def wait_for(pred, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def pub():
    p = Publisher()
    yield p
    p.close()


def subscriber(pub, **kw):
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{pub.pub_port}",
                            f"tcp://127.0.0.1:{pub.replay_port}", tail_check_s=0.3, **kw)
    sub.start()
    pub.wait_subscribed()
    return sub


def test_gaps_are_replayed_and_a_dropped_tail_is_recovered(pub):
    sub = subscriber(pub)
    try:
        for i in range(10):
            fmt = "map" if i % 2 else "array"
            events = [stored(i * 10, i * 10 + 1)]
            if i == 5:
                events.append(["BlockRemoved", [0, 1], "GPU"])  # old array-style event
            pub.publish(events, drop=i in (3, 7, 9), fmt=fmt)
        assert wait_for(lambda: sub.last_seq == 9), sub.stats()
        stats = sub.stats()
        # Three batches were dropped, but one replay may recover several: a replay asked at
        # the first gap (seq 3) returns all that is published by then, often 7 and 9 too, and
        # those gaps are never seen (CI, a loaded box: gaps 2). What must hold: nothing lost,
        # every dropped batch came back by replay.
        assert stats["gaps"] >= 1 and stats["lost"] == 0 and stats["replayed"] >= 3
        assert stats["blocks"] == 18  # 20 stored, 2 removed
    finally:
        sub.stop()


def test_late_subscriber_rebuilds_from_the_replay_buffer(pub):
    for i in range(5):
        pub.publish([stored(i)])
    sub = subscriber(pub)
    try:
        pub.publish([stored(99)])
        assert wait_for(lambda: sub.last_seq == 5)
        assert sub.block_count == 6 and sub.stats()["gaps"] == 0
        assert sub.stats()["complete"] is True  # the replay reached back to seq 0
    finally:
        sub.stop()


def test_publisher_restart_resets_state_and_unknown_events_are_counted(pub):
    sub = subscriber(pub)
    try:
        pub.publish([stored(1, 2, 3)])
        pub.publish([stored(4)])
        assert wait_for(lambda: sub.block_count == 4)
        pub.restart()  # engine restarted: its cache is empty, sequence starts over
        pub.publish([stored(7), {"type": "Brand new", "x": 1}, ["Future", 1]])
        assert wait_for(lambda: sub.restarts == 1 and sub.block_count == 1), sub.stats()
        assert sub.stats()["unknown_events"] == 2
    finally:
        sub.stop()


def test_garbage_frames_are_counted_not_fatal(pub):
    sub = subscriber(pub)
    try:
        pub.pub.send_multipart([b"kv-events", (0).to_bytes(8, "big"), b"\xc1garbage"])
        pub.pub.send_multipart([b"only-two", b"frames"])
        pub.seq = 1
        pub.publish([stored(5)])
        assert wait_for(lambda: sub.block_count == 1)
        assert sub.stats()["decode_errors"] == 2
    finally:
        sub.stop()
