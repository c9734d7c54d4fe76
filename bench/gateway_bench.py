"""Gateway benchmark: the Mooncake trace through pdplane's gateway and its peers, side by side.

Phase 1 (routing quality): for each router, a fresh simulated fleet (same config, cold
caches), the first N requests of the Mooncake synthetic trace replayed through the router
(arrivals sped up), measured by the sim's workload player: prefix-cache hit rate from the
engines' /metrics, TTFT p50/p95, failures.

Phase 2 (added latency): a near-zero-latency stub backend, called directly and through each
router; added latency = percentile through the router − percentile direct. With both
``pdplane`` and ``sglang-router`` run, the JSON's ``latency.goal`` judges issue 19's goal
per mode and concurrency, on the medians and round by round (:func:`latency_goal`).

Routers: ``pdplane`` (this gateway, approximate prefix index), ``pdplane-events`` (plus KV
events and /tokenize for exact matching), ``round-robin`` (vllm-router's), ``vllm-router``
and ``sglang-router`` (cache_aware). The peers come from PyPI into their own venv (not
project dependencies)::

    python3 -m venv ~/.cache/pdplane-peers
    ~/.cache/pdplane-peers/bin/pip install vllm-router sglang-router

Run (≈6 min on the 2-core box)::

    .venv/bin/python bench/gateway_bench.py --limit 200 --speedup 5 --time-scale 0.2 \
        --json var/gateway_bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.statictable import static_table, table_from_sim_endpoints  # noqa: E402
from tests.conftest import free_port, wait_for_port  # noqa: E402
from workers_agent.sim.fleetconfig import parse_fleet_config  # noqa: E402
from workers_agent.sim.launcher import FleetProcesses  # noqa: E402
from workers_agent.sim.player import replay  # noqa: E402
from workers_agent.sim.workload import (  # noqa: E402
    MOONCAKE_BLOCK_TOKENS,
    PromptFactory,
    load_trace,
)

TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_synthetic.jsonl"
PEERS_BIN = Path(os.environ.get("PDPLANE_PEERS_BIN", str(Path.home() / ".cache/pdplane-peers/bin")))
MODEL = "llama-3.3-70b-fp8"
ROUTING_OVERRIDES: dict[str, float] = {}  # --routing kv_overlap_weight=2,load_weight=1
KV_TOKENS = [0]  # per engine, as the control plane's table would say (from --num-gpu-blocks)
ALL_ROUTERS = ("pdplane", "pdplane-events", "round-robin", "vllm-router", "sglang-router")
# Also "pdplane-2p": the gateway as two processes on one port (--workers 2), and
# "pdplane-aiohttp": this gateway on aiohttp's server (--server aiohttp), on request.
# Before/after in one interleaved run: PDPLANE_BASELINE_ROOT=<a checkout of an older commit>
# adds the router "pdplane-baseline", that checkout's gateway (latency phase).
BASELINE_ROOT = os.environ.get("PDPLANE_BASELINE_ROOT")


def fleet_config(engines: int, time_scale: float, num_gpu_blocks: int) -> dict:
    nodes, entries = [], []
    for i in range(engines):
        nodes.append({"hostname": f"n{i}", "gpu": "H200", "gpu_count": 1,
                      "nics": [{"name": "ib0", "line_rate_gbps": 400, "transport": "infiniband",
                                "rdma": True}]})
        entry = {"id": f"e{i}", "node": f"n{i}", "model": MODEL, "gpus": [0], "role": "both",
                 "block_size": 16}
        if num_gpu_blocks > 0:  # 0: as many as the GPU's memory allows
            entry["num_gpu_blocks"] = num_gpu_blocks
        entries.append(entry)
    return {"time_scale": time_scale, "nodes": nodes, "engines": entries}


class Router:
    """One router process in front of a list of worker URLs."""

    def __init__(self, name: str, endpoints: dict, workdir: Path, urls: list[str] | None = None):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        urls = urls or [e["api_url"] for e in endpoints["engines"]]
        log = open(workdir / f"{name}-{self.port}.log", "wb")  # noqa: SIM115 - closed by stop
        self.log = log
        if name.startswith("pdplane"):
            if endpoints.get("engines"):
                table = table_from_sim_endpoints(endpoints, mode="aggregated",
                                                 routing=ROUTING_OVERRIDES or None,
                                                 kv_tokens=KV_TOKENS[0])
            else:
                table = static_table(MODEL, [{"url": u} for u in urls])
            table_path = workdir / f"table-{self.port}.json"
            table_path.write_text(json.dumps(table))
            cmd = [sys.executable, "-m", "gateway", "--port", str(self.port), "--table",
                   str(table_path), "--seed", "1", "--log-level", "WARNING"]
            cmd += ["--tokenize-via-engine"] if name == "pdplane-events" else ["--no-kv-events"]
            if name == "pdplane-2p":  # two processes on one port, sharing routing state
                cmd += ["--workers", "2"]
            if name == "pdplane-aiohttp":  # the same gateway, served by aiohttp
                cmd += ["--server", "aiohttp"]
        elif name in ("round-robin", "vllm-router"):
            policy = "round_robin" if name == "round-robin" else "cache_aware"
            cmd = [str(PEERS_BIN / "vllm-router"), "--host", "127.0.0.1", "--port",
                   str(self.port), "--prometheus-port", str(free_port()), "--policy", policy,
                   "--log-level", "warning", "--worker-urls", *urls]
        elif name == "sglang-router":
            cmd = [str(PEERS_BIN / "sglang-router"), "launch", "--host", "127.0.0.1", "--port",
                   str(self.port), "--prometheus-port", str(free_port()), "--policy",
                   "cache_aware", "--log-level", "warn", "--worker-urls", *urls]
        else:
            raise ValueError(name)
        cwd = BASELINE_ROOT if name == "pdplane-baseline" else ROOT
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, timeout=30)
        self._wait_routable(urls)

    def _wait_routable(self, urls: list[str]) -> None:
        import urllib.request

        body = json.dumps({"model": MODEL, "prompt": "warm up", "max_tokens": 1}).encode()
        deadline = time.monotonic() + 30
        ok = 0
        while time.monotonic() < deadline and ok < 2 * len(urls):
            try:
                req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    ok += r.status == 200
            except OSError:
                time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def available(names: list[str]) -> tuple[list[str], dict[str, str]]:
    skipped = {}
    ok = []
    for name in names:
        binary = {"round-robin": "vllm-router", "vllm-router": "vllm-router",
                  "sglang-router": "sglang-router"}.get(name)
        if binary and not (PEERS_BIN / binary).exists():
            skipped[name] = f"{PEERS_BIN / binary} not installed"
        else:
            ok.append(name)
    return ok, skipped


def scaled_workload(args):
    """The trace, optionally shrunk: every 512-token block becomes 512/prompt_scale tokens
    (prefix sharing is kept exactly), outputs divided by output_scale. On a 2-core box the
    full-size prompts (15k tokens of text each) make the run CPU-bound, not engine-bound."""
    workload = load_trace(args.trace, args.speedup, args.limit)
    if args.prompt_scale > 1 or args.output_scale > 1:
        workload.prompts = PromptFactory(block_tokens=MOONCAKE_BLOCK_TOKENS // args.prompt_scale)
        for req in workload.requests:
            req.input_length = max(req.input_length // args.prompt_scale, 1)
            req.output_length = max(req.output_length // args.output_scale, 1)
    return workload


def run_quality(args, names: list[str], workdir: Path) -> dict:
    """Every router, ``--repeat`` times, interleaved (round 1: every router, round 2: …) so
    that a change in the box's load hits all of them alike."""
    workload = scaled_workload(args)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_no in range(1, args.repeat + 1):
        for name in names:
            runs[name].append(_quality_once(args, workload, name, workdir))
            print(f"round {round_no} {name:15s} {json.dumps(runs[name][-1])}", flush=True)
    results = {}
    for name, rows in runs.items():
        def col(key, rows=rows):
            return [r[key] for r in rows if r[key] is not None]
        hits = col("prefix_hit_rate")
        results[name] = {
            "runs": rows,
            "prefix_hit_rate_mean": sum(hits) / len(hits) if hits else None,
            "prefix_hit_rate_min": min(hits, default=None),
            "prefix_hit_rate_max": max(hits, default=None),
            "ttft_p50_ms_mean": _mean(col("ttft_p50_ms")),
            "ttft_p95_ms_mean": _mean(col("ttft_p95_ms")),
            "failed": sum(r["failed"] for r in rows),
        }
    print("| router | hit rate mean (min–max) | TTFT p50 mean | TTFT p95 mean | failed |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        if r["prefix_hit_rate_mean"] is None:
            continue
        print(f"| {name} | {r['prefix_hit_rate_mean']:.2%} ({r['prefix_hit_rate_min']:.2%}–"
              f"{r['prefix_hit_rate_max']:.2%}) | {r['ttft_p50_ms_mean']:.0f} ms | "
              f"{r['ttft_p95_ms_mean']:.0f} ms | {r['failed']} |", flush=True)
    return results


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _quality_once(args, workload, name: str, workdir: Path) -> dict:
    config = parse_fleet_config(fleet_config(args.engines, args.time_scale, args.num_gpu_blocks))
    fleet = FleetProcesses(config)
    fleet.start(timeout=60)
    router = None
    try:
        endpoints = fleet.endpoints
        router = Router(name, endpoints, workdir)
        metrics = [e["metrics_url"] for e in endpoints["engines"]]
        report = asyncio.run(replay(workload, router.url, args.slo_ttft_ms, args.slo_itl_ms,
                                    metrics_urls=metrics, model=MODEL, num_gpus=args.engines))
        s = report.summary
        hit = (report.prefix_hits / report.prefix_queries) if report.prefix_queries else None
        return {
            "completed": s.completed, "failed": s.failed, "wall_s": report.wall_seconds,
            "prefix_hit_rate": hit, "ttft_p50_ms": s.ttft_ms.get("p50"),
            "ttft_p95_ms": s.ttft_ms.get("p95"), "ttft_p99_ms": s.ttft_ms.get("p99"),
            "itl_p95_ms": s.itl_ms.get("p95"), "slo_attainment": s.slo_attainment,
        }
    finally:
        if router:
            router.stop()
        fleet.stop()


# --- added latency ----------------------------------------------------------------------

STUB = r"""
import json, sys
MODEL = sys.argv[2]
from aiohttp import web
BODY = json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}}).encode()
CHUNK = (b'data: {"id":"cmpl-x","object":"text_completion","model":"m",'
         b'"choices":[{"index":0,"text":"ok"}]}\n\n')
async def completions(request):
    body = await request.read()
    if b'"stream": true' in body or b'"stream":true' in body:
        r = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await r.prepare(request)
        await r.write(CHUNK)
        await r.write(CHUNK + b"data: [DONE]\n\n")
        await r.write_eof()
        return r
    return web.Response(body=BODY, content_type="application/json")
async def models(request):
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
async def health(request):
    return web.Response(text="ok")
async def tokenize(request):
    return web.json_response({"tokens": [1, 2, 3, 4], "count": 4, "max_model_len": 4096})
app = web.Application()
app.router.add_post("/v1/completions", completions)
app.router.add_post("/v1/chat/completions", completions)
app.router.add_get("/v1/models", models)
app.router.add_get("/health", health)
app.router.add_post("/tokenize", tokenize)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""
MODES = ("nonstream", "stream")
CONCURRENCY = (1, 8, 64)


async def _latencies(url: str, n: int, concurrency: int, mode: str) -> list[float]:
    """Per request: the whole answer (non-streaming), or the first body byte (streaming
    TTFB; the rest is read too, untimed)."""
    import aiohttp

    body = json.dumps({"model": MODEL, "prompt": "hello world how are you, " * 8,
                       "max_tokens": 1, "stream": mode == "stream"})
    headers = {"Content-Type": "application/json"}
    out: list[float] = []
    left = [n]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> float:
            t0 = time.perf_counter()
            async with session.post(url + "/v1/completions", data=body, headers=headers) as r:
                if mode == "stream":
                    await r.content.readany()
                    elapsed = time.perf_counter() - t0
                    await r.read()
                else:
                    await r.read()
                    elapsed = time.perf_counter() - t0
                assert r.status == 200, r.status
            return elapsed

        async def worker():
            while left[0] > 0:
                left[0] -= 1
                out.append(await one())

        await asyncio.gather(*(one() for _ in range(max(20, concurrency))))  # warm up
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU so far of a process, its threads and its live child processes
    (``--workers 2`` runs under a supervisor) (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = task.read_text().split()
        except OSError:
            continue
        total += sum(cpu_seconds(int(child)) for child in children)
    return total


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def run_latency(args, names: list[str], workdir: Path) -> dict:
    """Added latency over a stub backend, interleaved: all routers run at once, and every
    round measures direct and each router at each concurrency and mode in turn, so a busy
    moment on a shared box hits them alike. Added = router percentile − direct percentile
    of the same round; reported: the median over rounds."""
    port = free_port()
    stub_path = workdir / "stub.py"
    stub_path.write_text(STUB)
    stub = subprocess.Popen([sys.executable, str(stub_path), str(port), MODEL], cwd=ROOT)
    routers: dict[str, Router] = {}
    samples: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    try:
        wait_for_port(port)
        direct_url = f"http://127.0.0.1:{port}"
        for name in names:
            if name != "pdplane-events":
                routers[name] = Router(name, {"engines": []}, workdir, urls=[direct_url])
        levels = args.concurrency
        for rnd in range(args.latency_rounds):
            for mode in MODES:
                for c in levels:
                    n = args.latency_requests
                    direct = asyncio.run(_latencies(direct_url, n, c, mode))
                    d50, d99 = pct(direct, 0.5), pct(direct, 0.99)
                    samples.setdefault(("direct", mode, c), []).append((d50, d99, 0.0))
                    for name, router in routers.items():
                        cpu0 = cpu_seconds(router.proc.pid)
                        lat = asyncio.run(_latencies(router.url, n, c, mode))
                        cpu = (cpu_seconds(router.proc.pid) - cpu0) / (n + max(20, c))
                        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
                        samples.setdefault((name, mode, c), []).append((p50, p99, cpu))
                        print(f"round {rnd + 1} {mode} c={c} {name}: +{(p50 - d50) * 1e3:.3f} "
                              f"/ +{(p99 - d99) * 1e3:.3f} ms", flush=True)
    finally:
        for router in routers.values():
            router.stop()
        stub.terminate()
        stub.wait(timeout=10)
    rows = []
    for (name, mode, c), values in samples.items():
        direct = samples[("direct", mode, c)]
        row = {"router": name, "mode": mode, "concurrency": c, "rounds": len(values),
               "p50_ms": _median([v[0] for v in values]) * 1e3,
               "p99_ms": _median([v[1] for v in values]) * 1e3}
        if name != "direct":
            # CPU the router spent per request: unlike latency, barely moved by a busy box.
            row["cpu_ms_per_request"] = _median([v[2] for v in values]) * 1e3
            row["added_p50_ms"] = _median(_added(values, direct, 0))
            row["added_p99_ms"] = _median(_added(values, direct, 1))
        rows.append(row)
    out = {"rows": rows, "by_key": {f"{r['router']}_{r['mode']}_c{r['concurrency']}": r
                                    for r in rows}}
    goal = latency_goal(samples)
    if goal:
        out["goal"] = goal
    return out


# Issue 19's latency goal, against sglang-router cache_aware: added p50 at most its own at
# c=8 and c=64 and at most C1_P50_MS at c=1; added p99 at most P99_RATIO × its own.
C1_P50_MS = 0.35
P99_RATIO = 1.5
PEER = "sglang-router"


def _added(values: list, direct: list, q: int) -> list[float]:
    """Per round, ms: the router's percentile ``q`` (0: p50, 1: p99) less direct's."""
    return [(v[q] - d[q]) * 1e3 for v, d in zip(values, direct, strict=True)]


def latency_goal(samples: dict, router: str = "pdplane", peer: str = PEER) -> dict:
    """Per mode and concurrency: the goal judged on the medians (as the rows report them)
    and in how many rounds it held. A round's added latency is that round's percentile
    minus the same round's direct one, so each round is a verdict of its own: on a shared
    2-core box one run's medians can sit on either side of a gap of a tenth of a
    millisecond, and the count says how often. Empty when either router did not run."""
    goal = {}
    for (name, mode, c), ours in samples.items():
        if name != router or (peer, mode, c) not in samples:
            continue
        theirs, direct = samples[(peer, mode, c)], samples[("direct", mode, c)]

        ours50, theirs50 = _added(ours, direct, 0), _added(theirs, direct, 0)
        ours99, theirs99 = _added(ours, direct, 1), _added(theirs, direct, 1)
        p50_ok = [a <= C1_P50_MS if c == 1 else a <= b for a, b in zip(ours50, theirs50,
                                                                      strict=True)]
        p99_ok = [a <= P99_RATIO * max(b, 0.0) for a, b in zip(ours99, theirs99, strict=True)]
        p50_limit = C1_P50_MS if c == 1 else _median(theirs50)
        p99_limit = P99_RATIO * max(_median(theirs99), 0.0)
        goal[f"{mode}_c{c}"] = {
            "p50_limit_ms": round(p50_limit, 4), "p99_limit_ms": round(p99_limit, 4),
            "p50_met": _median(ours50) <= p50_limit, "p99_met": _median(ours99) <= p99_limit,
            "p50_rounds_met": sum(p50_ok), "p99_rounds_met": sum(p99_ok),
            "rounds": len(p50_ok),
        }
    return goal


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def print_latency_table(latency: dict) -> None:
    """Added latency per router; the ``direct`` rows (the bench's client straight to the
    stub, on the same cores) give the absolute p50 / p99 the additions are measured from."""
    rows = latency["rows"]
    print(f"{'router':16} {'mode':10} {'c':>3} {'added p50 ms':>13} {'added p99 ms':>13} "
          f"{'CPU ms/req':>11}")
    for r in sorted(rows, key=lambda r: (r["mode"], r["concurrency"], r["router"])):
        if r["router"] == "direct":
            print(f"{'direct (abs.)':16} {r['mode']:10} {r['concurrency']:>3} "
                  f"{r['p50_ms']:>13.3f} {r['p99_ms']:>13.3f} {'':>11}")
            continue
        print(f"{r['router']:16} {r['mode']:10} {r['concurrency']:>3} "
              f"{r['added_p50_ms']:>13.3f} {r['added_p99_ms']:>13.3f} "
              f"{r['cpu_ms_per_request']:>11.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--limit", type=int, default=600)
    p.add_argument("--speedup", type=float, default=6.0)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--prompt-scale", type=int, default=16,
                   help="divide prompt lengths (and the 512-token trace block) by this")
    p.add_argument("--output-scale", type=int, default=4)
    p.add_argument("--num-gpu-blocks", type=int, default=5000)
    p.add_argument("--routers", default=",".join(ALL_ROUTERS))
    p.add_argument("--slo-ttft-ms", type=float, default=2000)
    p.add_argument("--slo-itl-ms", type=float, default=100)
    p.add_argument("--latency-requests", type=int, default=1000,
                   help="requests per router, concurrency, mode and round")
    p.add_argument("--latency-rounds", type=int, default=3)
    p.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")],
                   default=list(CONCURRENCY), help="comma-separated levels (1,8,64)")
    p.add_argument("--quick", action="store_true",
                   help="latency only, 300 requests, 2 rounds (a smoke run)")
    p.add_argument("--repeat", type=int, default=1,
                   help="routing-quality rounds (every router once per round)")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--no-capacity", action="store_true",
                   help="leave workers' kv_tokens out of pdplane's table (unbounded index)")
    p.add_argument("--routing", default="",
                   help="table routing weights for pdplane, e.g. kv_overlap_weight=2")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()
    if args.quick:
        args.skip_quality, args.latency_requests, args.latency_rounds = True, 300, 2
    if not Path(args.trace).exists():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2
    for item in filter(None, args.routing.split(",")):
        key, _, value = item.partition("=")
        ROUTING_OVERRIDES[key] = float(value)
    KV_TOKENS[0] = 0 if args.no_capacity else max(args.num_gpu_blocks, 0) * 16
    names, skipped = available(args.routers.split(","))
    if BASELINE_ROOT and "pdplane-baseline" not in names:
        names.append("pdplane-baseline")
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", flush=True)
    out = {"args": vars(args), "skipped": skipped}
    with tempfile.TemporaryDirectory(prefix="gwbench-") as tmp:
        workdir = Path(tmp)
        if not args.skip_quality:
            out["quality"] = run_quality(args, names, workdir)
        if not args.skip_latency:
            out["latency"] = run_latency(args, names, workdir)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=2))
    if args.json_out:
        print(f"written to {args.json_out}")
    else:
        print(json.dumps(out, indent=2))
    if "latency" in out:
        print_latency_table(out["latency"])
        for key, g in sorted(out["latency"].get("goal", {}).items()):
            print(f"goal {key}: p50 {'met' if g['p50_met'] else 'NOT met'} "
                  f"({g['p50_rounds_met']} of {g['rounds']} rounds), p99 "
                  f"{'met' if g['p99_met'] else 'NOT met'} ({g['p99_rounds_met']} of "
                  f"{g['rounds']} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
