"""The one engine driver: tracking, latency bookkeeping and held P/D blocks, clock-free."""

from __future__ import annotations

from workers_agent.sim import links
from workers_agent.sim.driver import EngineDriver, NicQueue, kv_lanes, transfer_seconds
from workers_agent.sim.engine import EngineSpec, SimEngine, SimRequest

MODEL = "llama-3.3-70b-fp8"


class Recorder:
    def __init__(self):
        self.ttfts, self.gaps, self.done = [], [], []

    def first_token(self, tracked, ttft):
        self.ttfts.append(ttft)

    def token_gaps(self, tracked, gap, count):
        self.gaps.extend([gap] * count)

    def finished(self, tracked, *, queued, prefill, decode):
        self.done.append((tracked.request_id, queued, prefill, decode))


def drive(driver, now=0.0, bursts=False):
    """A minimal clock: run steps back to back until nothing is left."""
    updates = []
    while True:
        step = driver.decode_burst(now, float("inf")) if bursts else None
        if step is None:
            step = driver.next_step(now)
        if step is None:
            return updates, now
        end = step.times[-1] if hasattr(step, "times") else now + step.duration
        updates += driver.finish(step, end)
        now = end


def test_tracks_first_token_gaps_and_finish_with_an_observer():
    recorder = Recorder()
    driver = EngineDriver(SimEngine(EngineSpec("e", MODEL, "H200")), recorder)
    tracked = driver.submit(SimRequest("r1", list(range(100, 600)), 8, 0.0))
    updates, end = drive(driver)
    assert [u.first for u in updates].count(True) == 1 and updates[-1].finished
    assert tracked.generated == 8 and len(tracked.itls) == 7 and tracked.finished_at == end
    assert recorder.ttfts == [tracked.ttft] and recorder.gaps == tracked.itls
    rid, queued, prefill, decode = recorder.done[0]
    assert rid == "r1" and queued == 0 and abs(prefill - tracked.ttft) < 1e-9
    assert abs(queued + prefill + decode - tracked.e2e) < 1e-9
    assert not driver.requests


def test_bursts_give_the_same_latencies_as_steps():
    def run(bursts):
        driver = EngineDriver(SimEngine(EngineSpec("e", MODEL, "H200")))
        a = driver.submit(SimRequest("a", list(range(100, 400)), 30, 0.0))
        b = driver.submit(SimRequest("b", list(range(500, 900)), 20, 0.0))
        drive(driver, bursts=bursts)
        return a.itls + b.itls, a.ttft, b.finished_at

    assert run(True) == run(False)


def test_held_prefill_blocks_until_taken_or_expired():
    driver = EngineDriver(SimEngine(EngineSpec("p", MODEL, "H200")))
    driver.submit(SimRequest("x", list(range(100, 900)), 1, 0.0, hold_for_remote_decode=True))
    driver.submit(SimRequest("y", list(range(1000, 1800)), 1, 0.0, hold_for_remote_decode=True))
    _, end = drive(driver)
    assert set(driver.held) == {"x", "y"} and driver.held["x"].num_tokens == 800
    used = driver.engine.stats().num_used_blocks
    held = driver.take_held("x")
    assert held.block_ids and driver.engine.stats().num_used_blocks < used
    assert driver.take_held("x") is None
    assert driver.expire_held(end + 10, 5.0) == ["y"] and not driver.held


def test_transfer_rule_lanes_and_nic_queue():
    nvl, nic = links.nvlink(450), links.nic(400)
    assert kv_lanes(nvl, 4, 2) == 2 and kv_lanes(nic, 4, 4) == 1
    one = transfer_seconds(nvl, 4000, 163840, 1, 1)
    assert abs(transfer_seconds(nvl, 4000, 163840, 2, 2) - nvl.latency_s
               - (one - nvl.latency_s) / 2) < 1e-9
    queue = NicQueue()
    first = queue.delay(nic, "n1", "n2", 0.0, 0.5)
    second = queue.delay(nic, "n1", "n3", 0.1, 0.5)  # waits for n1's NIC
    assert first == 0.5 and abs(second - 0.9) < 1e-9
    assert queue.delay(nvl, "n1", "n1", 0.1, 0.2) == 0.2  # NVLink is not queued
