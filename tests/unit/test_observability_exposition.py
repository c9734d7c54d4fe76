"""pdplane's own metrics: multi-process merge, the agent's /metrics, reader fall-back speed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import urllib.request
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from controlplane.observability.promread import FleetLatencyReader, prom_duration
from tests.conftest import ROOT, WAIT_S, free_port, python_env, wait_for_port
from workers_agent.collectors.kv_events import KVBlockState
from workers_agent.config import load


def _values(text: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_durations_are_integer_milliseconds():
    # Prometheus refuses "3.0s" (bad_data); the reader's timeout must always parse.
    assert prom_duration(3.0) == "3000ms"
    assert prom_duration(0.25) == "250ms"
    assert prom_duration(0.0001) == "1ms"


def test_reader_falls_back_at_once_when_prometheus_is_down():
    reader = FleetLatencyReader(f"http://127.0.0.1:{free_port()}", timeout_s=10, cache_s=0)
    started = time.monotonic()
    assert reader.model_figures("m") is None
    assert reader.worker_figures("m", "n/w") is None
    # No client retries with backoff and no wait for the 10 s timeout: a refused connection
    # costs milliseconds; the bound leaves a starved box its margin.
    assert time.monotonic() - started < 5.0


def test_counters_of_several_processes_are_summed(tmp_path):
    """Two processes count into PROMETHEUS_MULTIPROC_DIR; a third renders one total."""
    env = python_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    bump = textwrap.dedent("""
        import sys
        from controlplane.observability import metrics as m
        n = int(sys.argv[1])
        m.REPORTS_INGESTED.inc(n)
        m.PLANS.labels("keep").inc(n)
        m.PLANNING_DURATION.observe(0.01 * n)
        m.MESSAGES_REJECTED.labels("bad_json").inc()
    """)
    for n in (3, 4):
        subprocess.run([sys.executable, "-c", bump, str(n)], cwd=ROOT, env=env, check=True,
                       timeout=60)
    render = textwrap.dedent("""
        import sys
        from controlplane.observability.metrics import exposition
        body, ctype = exposition()  # no Django set up: the state part is skipped, logged
        sys.stdout.write(body.decode())
    """)
    out = subprocess.run([sys.executable, "-c", render], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    values = _values(out)
    assert values[("pdplane_agent_reports_ingested_total", ())] == 7
    assert values[("pdplane_plans_total", (("outcome", "keep"),))] == 7
    assert values[("pdplane_planning_duration_seconds_count", ())] == 2
    assert abs(values[("pdplane_planning_duration_seconds_sum", ())] - 0.07) < 1e-9
    assert values[("pdplane_agent_messages_rejected_total", (("reason", "bad_json"),))] == 2


class _FakeSubscriber:
    def __init__(self):
        self.state = KVBlockState()
        self.state.blocks = {1, 2, 3}
        self.state.stored_events, self.state.removed_events = 5, 2
        self.batches, self.gaps, self.lost, self.replayed, self.decode_errors = 9, 1, 0, 2, 0


def test_agent_metrics_endpoint(tmp_path):
    from workers_agent import metrics as agent_metrics

    agent = SimpleNamespace(engines={
        "e0": SimpleNamespace(kv=_FakeSubscriber()),
        "e1": SimpleNamespace(kv=None),
    })
    port = free_port()
    agent_metrics.COLLECTOR_ERRORS.labels("engine").inc()
    agent_metrics.serve(agent, port, "127.0.0.1")
    wait_for_port(port)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as resp:
        values = _values(resp.read().decode())
    e0 = (("engine", "e0"),)
    assert values[("pdplane_agent_kv_event_batches_total", e0)] == 9
    assert values[("pdplane_agent_kv_events_total", e0)] == 7
    assert values[("pdplane_agent_kv_event_gaps_total", e0)] == 1
    assert values[("pdplane_agent_kv_blocks", e0)] == 3
    assert values[("pdplane_agent_engines", ())] == 2
    assert values[("pdplane_agent_collector_errors_total", (("collector", "engine"),))] >= 1
    assert ("pdplane_agent_kv_event_gaps_total", (("engine", "e1"),)) not in values


def test_agent_metrics_port_is_configurable_and_off_by_default():
    env = {"PDPLANE_AGENT_SERVER": "ws://x/ws/agent/v1/", "PDPLANE_AGENT_TOKEN": "t"}
    assert load(None, env, {}).metrics_port is None
    assert load(None, {**env, "PDPLANE_AGENT_METRICS_PORT": "9400"}, {}).metrics_port == 9400
    assert load(None, env, {"metrics_port": 9401}).metrics_port == 9401
