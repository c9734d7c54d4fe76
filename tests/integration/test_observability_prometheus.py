"""A real Prometheus scraping simulated engines found through pdplane's HTTP SD endpoint.

Fleet: one simulated H200 node with two llama-3.1-8b engines (time_scale 0.2), a real
agent, the ASGI server with two uvicorn workers sharing PROMETHEUS_MULTIPROC_DIR, and
Prometheus (Debian's package) on loopback with ``http_sd_configs`` pointing at
``/api/v1/prometheus/targets`` (bearer ``METRICS_TOKEN``). Traffic runs only after
Prometheus has scraped the idle engines, so every bucket starts at zero inside the query
window and ``rate()`` scales all buckets of one series by the same factor: per worker, the
p95 pdplane reads equals the one computed here from two direct scrapes of the engine; per
model (two series, scraped at different instants) it agrees within bucket resolution.
Then Prometheus is stopped and the reader and the planner's input fall back to the agents.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest
from django.db import connection
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from controlplane.observability.promread import FleetLatencyReader
from controlplane.planner import inputs as planner_inputs
from controlplane.telemetry import hotstate
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import Cluster, Node, ServedModel, Worker
from gateway.metrics import GatewayMetrics
from tests.conftest import (
    ROOT,
    WAIT_S,
    free_port,
    python_env,
    require_system_part,
    stop_process,
    wait_for_port,
)
from tests.integration.test_agent_sim import database_url, one_node_fleet, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="the ASGI server needs the shared test database"),
]

MODEL = "llama-3.1-8b"
HOST = "sim-prom-1"
TOKEN = "metrics-" + uuid.uuid4().hex
PROMETHEUS = shutil.which("prometheus")


# --------------------------------------------------------------------------- helpers


def get(url: str, token: str | None = None, timeout: float = WAIT_S) -> bytes:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample_value(fams: dict, family: str, sample: str, **labels) -> float:
    total = 0.0
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def buckets(text: str, family: str) -> dict[float, float]:
    """upper bound → cumulative count of one engine's histogram (model MODEL)."""
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name == family + "_bucket" and s.labels.get("model_name") == MODEL:
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
    return out


def histogram_quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """Prometheus's histogram_quantile over cumulative bucket counts (promql/quantile.go)."""
    bounds = sorted(cumulative)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    counts = [cumulative[b] for b in bounds]
    for i in range(1, len(counts)):  # ensure monotonic
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def delta(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    return {le: after[le] - before.get(le, 0.0) for le in after}


def bucket_of(value: float, bounds: list[float]) -> tuple[float, float]:
    lower = 0.0
    for b in sorted(bounds):
        if value <= b:
            return lower, b
        lower = b
    return lower, math.inf


async def drive_traffic(api_urls: list[str], seconds: float, concurrency: int = 4) -> int:
    import aiohttp

    rng = random.Random(7)
    done = 0
    deadline = time.monotonic() + seconds

    async def client(url: str):
        nonlocal done
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            while time.monotonic() < deadline:
                words = rng.randint(20, 1500)
                prompt = " ".join(f"w{rng.randint(0, 5000)}" for _ in range(words))
                body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(4, 48)}
                async with s.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
                done += 1

    await asyncio.gather(*(client(u) for u in api_urls for _ in range(concurrency)))
    return done


class Prometheus:
    def __init__(self, workdir, sd_url: str, control_plane: str, gateway: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        cp_host = control_plane.removeprefix("http://")
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "pdplane-sd", "http_sd_configs": [
                    {"url": sd_url, "refresh_interval": "2s",
                     "authorization": {"type": "Bearer", "credentials": TOKEN}}]},
                {"job_name": "pdplane", "static_configs": [{"targets": [cp_host]}],
                 "authorization": {"type": "Bearer", "credentials": TOKEN}},
                {"job_name": "pdplane-gateway", "static_configs": [{"targets": [gateway]}]},
            ],
        }
        # Prometheus reads YAML; JSON is YAML.
        (workdir / "prometheus.yml").write_text(json.dumps(config))
        self.proc = None

    def start(self):
        self.log = open(self.workdir / "prometheus.log", "w")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, process=self.proc)
        wait_until(lambda: self._ready(), 30, what="prometheus ready")

    def _ready(self) -> bool:
        try:
            return get(self.url + "/-/ready", timeout=2) is not None
        except OSError:
            return False

    def query(self, expr: str) -> list:
        from urllib.parse import urlencode

        body = json.loads(get(f"{self.url}/api/v1/query?{urlencode({'query': expr})}"))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self):
        stop_process(self.proc)
        if self.proc is not None:
            self.log.close()


# --------------------------------------------------------------------------- the test


def test_prometheus_reads_match_engine_histograms_and_fall_back(tmp_path, settings):
    if PROMETHEUS is None:
        require_system_part("prometheus", "the prometheus binary is not installed",
                            "apt-get install prometheus")
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    settings.TELEMETRY_REDIS_PREFIX = prefix
    cluster = Cluster.objects.create(name="prom-e2e")
    served = ServedModel.objects.create(cluster=cluster, name=MODEL, layers=32, kv_heads=8,
                                        head_dim=128, kv_dtype_bytes=2,
                                        weight_bytes=16 * 10**9)
    node = Node.objects.create(cluster=cluster, hostname=HOST)
    (tmp_path / "token").write_text(issue_token(node))
    fleet = one_node_fleet(HOST, 2, 0.2)
    (tmp_path / "fleet.json").write_text(json.dumps(fleet))
    endpoints = tmp_path / "endpoints.json"
    multiproc = tmp_path / "prom-multiproc"
    multiproc.mkdir()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    agent_port = free_port()
    env = python_env(DATABASE_URL=database_url(), PDPLANE_TELEMETRY_PREFIX=prefix,
                     PDPLANE_REPORT_INTERVAL_S="0.5", PDPLANE_AGENT_MAX_REPORTS_PER_S="20",
                     METRICS_TOKEN=TOKEN, PROMETHEUS_MULTIPROC_DIR=str(multiproc),
                     ALLOWED_HOSTS="127.0.0.1,localhost", PDPLANE_VAR_DIR=str(tmp_path))
    procs: list[subprocess.Popen] = []
    logs = []
    prom = gw_server = None

    def spawn(args, name, proc_env=None):
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed in finally
        logs.append(log)
        proc = subprocess.Popen(args, cwd=ROOT, env=proc_env, stdout=log,
                                stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        spawn([sys.executable, "-m", "workers_agent.sim.cli", "run", "--config",
               str(tmp_path / "fleet.json"), "--endpoints-out", str(endpoints),
               "--in-process"], "sim")
        wait_until(endpoints.exists, 60, what="sim endpoints")
        sim = json.loads(endpoints.read_text())
        # Two uvicorn workers: /metrics must show both processes' counters summed.
        server = spawn([sys.executable, "-m", "uvicorn", "controlplane.asgi:application",
                        "--host", "127.0.0.1", "--port", str(port), "--workers", "2",
                        "--log-level", "warning"], "server", env)
        wait_for_port(port, process=server)
        spawn([sys.executable, "-m", "workers_agent.cli", "--server",
               f"ws://127.0.0.1:{port}/ws/agent/v1/", "--token-file", str(tmp_path / "token"),
               "--hostname", HOST, "--sim-node-url", sim["nodes"][0]["telemetry_url"],
               "--metrics-port", str(agent_port)], "agent", python_env())
        wait_until(lambda: Worker.objects.filter(node=node).exclude(metrics_url="").count() == 2,
                   40, what="workers with metrics URLs")

        # The SD endpoint: bearer-guarded, both engines with pdplane's labels.
        with pytest.raises(urllib.error.HTTPError):
            get(base + "/api/v1/prometheus/targets?cluster=prom-e2e")
        sd = json.loads(get(base + "/api/v1/prometheus/targets?cluster=prom-e2e", TOKEN))
        engine_groups = [g for g in sd if g["labels"]["job"].startswith("pdplane-engine")]
        assert len(engine_groups) == 2
        worker_label = {}  # engine id → the SD ``worker`` label
        for eng in sim["engines"]:
            address = eng["metrics_url"].split("//", 1)[1].split("/", 1)[0]
            group = next(g for g in engine_groups if g["targets"] == [address])
            assert group["labels"]["model"] == MODEL and group["labels"]["node"] == HOST
            assert group["labels"]["cluster"] == "prom-e2e"
            worker_label[eng["id"]] = group["labels"]["worker"]

        # The control plane's /metrics parses and moves under load (reports keep arriving);
        # with two workers, every answer carries the merged total.
        def reports_ingested() -> float:
            fams = families(get(base + "/metrics", TOKEN).decode())
            return sample_value(fams, "pdplane_agent_reports_ingested",
                                "pdplane_agent_reports_ingested_total")

        reports_0 = wait_until(reports_ingested, 20, what="a first report counted")
        # It moves: a later report is counted (the agent reports every second or two).
        reports_1 = wait_until(lambda: (v := reports_ingested()) > reports_0 and v, 30,
                               what="a later report counted")
        seen = []
        for _ in range(4):
            fams = families(get(base + "/metrics", TOKEN).decode())
            seen.append(sample_value(fams, "pdplane_agent_reports_ingested",
                                     "pdplane_agent_reports_ingested_total"))
        # Whichever uvicorn worker answers, it reports the merged total, never less.
        assert min(seen) >= reports_1 > reports_0 > 0, (reports_0, reports_1, seen)
        assert sample_value(fams, "pdplane_agent_report_lag_seconds",
                            "pdplane_agent_report_lag_seconds_count") > 0
        assert sample_value(fams, "pdplane_agents_connected", "pdplane_agents_connected") >= 1

        # The agent's own /metrics.
        agent_fams = families(get(f"http://127.0.0.1:{agent_port}/metrics").decode())
        assert sample_value(agent_fams, "pdplane_agent_collect_seconds",
                            "pdplane_agent_collect_seconds_count") > 0
        assert "pdplane_agent_kv_event_gaps" in agent_fams

        # A gateway's routing-decision counters (its own metrics class, served on a port):
        # at zero before the first scrape, so increase() over the window sees all of them.
        gw_metrics = GatewayMetrics()
        decided = {r: gw_metrics.decisions.labels(MODEL, r)
                   for r in ("kv_prefix", "kv_aware", "pd_remote_prefill")}
        gw_port = free_port()
        gw_server, _ = start_http_server(gw_port, "127.0.0.1", registry=gw_metrics.registry)
        # Prometheus: both engines up and scraped at least twice while idle.
        prom = Prometheus(tmp_path, base + "/api/v1/prometheus/targets?cluster=prom-e2e", base,
                          f"127.0.0.1:{gw_port}")
        prom.start()
        wait_until(lambda: len(prom.query('count_over_time(up{job=~"pdplane-engine.*"}[1m]) >= 2'))
                   == 2, WAIT_S, what="two scrapes of both engines")
        # Up: the latest scrape of each succeeded (one can run past its 1 s scrape timeout
        # on a starved box; the next one is the check).
        wait_until(lambda: len(prom.query('up{job=~"pdplane-engine.*"} == 1')) == 2, WAIT_S,
                   what="both engines up")

        engine_metrics = {e["id"]: e["metrics_url"] for e in sim["engines"]}
        before = {eid: get(url).decode() for eid, url in engine_metrics.items()}
        # 30 of the 100 aggregated-path decisions followed a prefix; P/D ones do not count.
        for reason, n in (("kv_prefix", 30), ("kv_aware", 70), ("pd_remote_prefill", 50)):
            decided[reason].inc(n)
        served_requests = asyncio.run(
            drive_traffic([e["api_url"] for e in sim["engines"]], seconds=6))
        assert served_requests > 10
        after = {eid: get(url).decode() for eid, url in engine_metrics.items()}
        # Two more scrapes after the traffic, the latest of each a success, then read.
        t_after = time.time()
        scraped = 'timestamp(up{job=~"pdplane-engine.*"} == 1)'
        wait_until(lambda: all(float(r["value"][1]) > t_after + 1 for r in prom.query(scraped))
                   and len(prom.query(scraped)) == 2, WAIT_S, what="scrapes after traffic")

        # The window reaches back before the first (idle) scrape: every bucket starts at 0.
        reader = FleetLatencyReader(prom.url, window="2m", cache_s=0, timeout_s=5)
        report = {}
        for family, attr in (("vllm:time_to_first_token_seconds", "ttft_p95_s"),
                             ("vllm:inter_token_latency_seconds", "itl_p95_s")):
            per_engine = {eid: delta(buckets(before[eid], family), buckets(after[eid], family))
                          for eid in engine_metrics}
            # Per worker: one series, the same extrapolation for every bucket → equal.
            for eid, d in per_engine.items():
                direct = histogram_quantile(0.95, d)
                figures = reader.worker_figures(MODEL, worker_label[eid])
                assert figures is not None and direct is not None
                read = getattr(figures, attr)
                report[(family, eid)] = (read, direct)
                assert read == pytest.approx(direct, rel=1e-6), (family, eid, read, direct)
            # Per model: summed over both engines, within bucket resolution.
            summed: dict[float, float] = {}
            for d in per_engine.values():
                for le, v in d.items():
                    summed[le] = summed.get(le, 0.0) + v
            direct = histogram_quantile(0.95, summed)
            read = getattr(reader.model_figures(MODEL), attr)
            lower, upper = bucket_of(direct, list(summed))
            assert abs(read - direct) <= upper - lower, (family, read, direct, lower, upper)
            report[(family, "model")] = (read, direct)
        print("p95 read vs direct:", report)
        model_figures = reader.model_figures(MODEL)
        assert model_figures.request_rate and model_figures.request_rate > 0
        assert model_figures.prompt_tokens_per_s and model_figures.prompt_tokens_per_s > 0
        # The planner's fleet figures (controlplane.telemetry.enginestats) from Prometheus:
        # the same counters and buckets, merged the same way.
        stats = reader.engine_stats(MODEL, 120.0)
        assert stats is not None and stats.source == "prometheus"
        # (Each query is evaluated at its own instant, so the sliding window moves a little.)
        assert stats.ttft_p95_s == pytest.approx(model_figures.ttft_p95_s, rel=0.02)
        assert stats.request_rate == pytest.approx(model_figures.request_rate, rel=0.02)
        assert stats.prompt_tokens_p95 and stats.generation_tokens_p95
        assert stats.prompt_tokens_mean and stats.generation_tokens_mean

        # The gateway's share of prefix-affinity decisions (one series per reason, scraped
        # at the same instants: the same extrapolation, so the ratio is exact).
        assert reader.affinity_share(MODEL, 120.0) == pytest.approx(0.3, rel=1e-3)
        assert reader.affinity_share("no-such-model", 120.0) is None

        # Prometheus scraped the control plane too, and the Grafana dashboard's queries parse.
        assert prom.query("pdplane_agent_reports_ingested_total > 0")
        dashboard = json.loads((ROOT / "docker/grafana/pdplane-dashboard.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                prom.query(target["expr"].replace("$__rate_interval", "30s"))

        # The planner's input reads Prometheus while it is up...
        settings.PROMETHEUS_URL = prom.url
        planner_inputs._reader = None
        wait_until(lambda: all(hotstate.worker_state(w.pk) for w in Worker.objects.filter(
            node=node)), WAIT_S, what="hot state")
        states = [hotstate.worker_state(w.pk) for w in Worker.objects.filter(node=node)]
        assert planner_inputs.measured_latency(served, states)[2] == "prometheus"
        load = planner_inputs._with_affinity(planner_inputs.LoadInput(), MODEL, 120.0)
        assert load.affinity_share == pytest.approx(0.3, rel=1e-3)
        assert "prometheus" in load.affinity_source

        # ...and falls back to the agents once it is gone, without raising.
        prom.stop()
        started = time.monotonic()
        assert reader.model_figures(MODEL) is None
        assert reader.worker_figures(MODEL, worker_label["e0"]) is None
        assert reader.affinity_share(MODEL, 120.0) is None
        planner_inputs._reader = None  # a new planning cycle: nothing cached
        ttft, _itl, source = planner_inputs.measured_latency(served, states)
        assert source == "agents"
        # Without an answer the share is unknown: the cost model's estimate, as before.
        assert planner_inputs._with_affinity(planner_inputs.LoadInput(), MODEL, 120.0
                                             ).affinity_share is None
        # No retry storm while Prometheus is down: refused connections cost milliseconds;
        # a wait for the reader's 5 s timeout per query would cost 20 s or more.
        assert time.monotonic() - started < 10.0
        agent_ttft = [s["ttft_p95_s"] for s in states if s.get("ttft_p95_s") is not None]
        assert ttft == (max(agent_ttft) if agent_ttft else None)
    finally:
        if prom is not None:
            prom.stop()
        if gw_server is not None:
            gw_server.shutdown()
        for proc in reversed(procs):
            stop_process(proc)
        for log in logs:
            log.close()
        planner_inputs._reader = None
        client = hotstate.sync_redis()
        keys = list(client.scan_iter(prefix + "*"))
        if keys:
            client.delete(*keys)
