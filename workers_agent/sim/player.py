"""Workload player: replays a trace or scenario against any OpenAI-compatible endpoint.

It sends each request at its arrival time (optionally sped up) to ``/v1/completions`` with
``stream: true``, measures time to first token and inter-token latency on the client side,
and reports percentiles, goodput under the given SLOs and the prefix-cache hit rate scraped
from the engines' ``/metrics`` before and after (``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries``, or their pre-0.3x ``gpu_`` names). Prompts are text built
with :func:`workers_agent.sim.tokens.decode`, so a simulated engine re-tokenises them to the
trace's exact token ids (and prefix hits happen where the trace says they do).

    python -m workers_agent.sim.player --url http://127.0.0.1:8000 \
        --trace ../shared/data/traces/mooncake_synthetic.jsonl --limit 200 --speedup 10 \
        --slo-ttft-ms 2000 --slo-itl-ms 50 --metrics-url http://127.0.0.1:8000/metrics
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from . import tokens
from .report import Summary, summarize
from .workload import Workload, WorkloadError, load_trace, scenario_workload

log = logging.getLogger(__name__)

HIT_FAMILIES = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
QUERY_FAMILIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")


@dataclass
class PlayerResult:
    request_id: str
    arrival: float  # seconds since the replay started (scheduled)
    prompt_tokens: int
    sent_at: float | None = None
    ttft: float | None = None  # from sending
    itls: list[float] = field(default_factory=list)
    finish_time: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens, when reported
    error: str | None = None


@dataclass
class PlayerReport:
    summary: Summary
    results: list[PlayerResult]
    prefix_hits: float | None
    prefix_queries: float | None
    wall_seconds: float

    def lines(self) -> list[str]:
        out = self.summary.lines()
        if self.prefix_queries:
            out.append(
                f"engines' /metrics: {self.prefix_hits:.0f} hit / {self.prefix_queries:.0f} "
                "queried prefix tokens during the run"
            )
        out.append(f"wall {self.wall_seconds:.1f} s")
        return out


def parse_prefix_counters(text: str) -> tuple[float, float]:
    """(hits, queries) summed over every engine/model label set of one scrape.

    Counters appear as ``name_total`` (with or without a ``# TYPE name counter`` line, which
    changes how the parser groups them), so samples are matched by name, not by family.
    When both generations of names are exported, only the current ones count.
    """
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_total"):
                name = name[: -len("_total")]
            if name in HIT_FAMILIES or name in QUERY_FAMILIES:
                sums[name] = sums.get(name, 0.0) + float(sample.value)
    if HIT_FAMILIES[0] in sums or QUERY_FAMILIES[0] in sums:
        return sums.get(HIT_FAMILIES[0], 0.0), sums.get(QUERY_FAMILIES[0], 0.0)
    return sums.get(HIT_FAMILIES[1], 0.0), sums.get(QUERY_FAMILIES[1], 0.0)


async def scrape(session: aiohttp.ClientSession, urls: list[str]) -> tuple[float, float] | None:
    hits = queries = 0.0
    for url in urls:
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    log.warning("scrape %s: HTTP %s", url, response.status)
                    return None
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("scrape %s: %s", url, exc)
            return None
        h, q = parse_prefix_counters(text)
        hits += h
        queries += q
    return hits, queries


async def _discover_model(session: aiohttp.ClientSession, base: str) -> str:
    async with session.get(f"{base}/v1/models") as response:
        response.raise_for_status()
        data = await response.json()
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{base}/v1/models lists no model")
    return str(models[0]["id"])


async def _one(
    session: aiohttp.ClientSession,
    base: str,
    model: str,
    prompt: str,
    max_tokens: int,
    result: PlayerResult,
    start: float,
) -> None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    sent = time.perf_counter()
    result.sent_at = sent - start
    last = None
    chunks = 0
    try:
        async with session.post(
            f"{base}/v1/completions", json=body, headers={"X-Request-Id": result.request_id}
        ) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                result.error = f"HTTP {response.status}: {text}"
                return
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    continue
                if "error" in chunk and not chunk.get("choices"):
                    result.error = str(chunk["error"])[:200]
                    return
                usage = chunk.get("usage")
                if usage:
                    result.output_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = int(details.get("cached_tokens") or 0)
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text"):
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - sent
                    else:
                        result.itls.append(now - last)
                    last = now
                    chunks += 1
    except (TimeoutError, aiohttp.ClientError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return
    result.finish_time = time.perf_counter() - start
    if not result.output_tokens:
        result.output_tokens = chunks
    if result.ttft is None and result.error is None:
        result.error = "no tokens streamed"


async def replay(
    workload: Workload,
    url: str,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    metrics_urls: list[str] | None = None,
    model: str | None = None,
    attainment: float = 0.9,
    num_gpus: int = 1,
    request_timeout_s: float = 600.0,
    max_concurrency: int = 1024,
) -> PlayerReport:
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    metrics_urls = metrics_urls or []
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max_concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if model is None:
            model = await _discover_model(session, base)
        before = await scrape(session, metrics_urls) if metrics_urls else None
        results = [
            PlayerResult(r.request_id, r.arrival, r.input_length) for r in workload.requests
        ]
        first = workload.requests[0].arrival if workload.requests else 0.0
        start = time.perf_counter()

        async def fire(req, result):
            delay = (req.arrival - first) - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = tokens.decode(workload.prompts.token_ids(req))
            await _one(session, base, model, prompt, req.output_length, result, start)

        await asyncio.gather(
            *(fire(req, res) for req, res in zip(workload.requests, results, strict=True))
        )
        wall = time.perf_counter() - start
        after = await scrape(session, metrics_urls) if metrics_urls else None
    hits = queries = None
    hit_rate = None
    if before is not None and after is not None:
        hits, queries = after[0] - before[0], after[1] - before[1]
        hit_rate = hits / queries if queries > 0 else None
    for result in results:
        result.arrival = result.sent_at if result.sent_at is not None else result.arrival
    summary = summarize(
        results, slo_ttft_ms, slo_itl_ms, attainment, num_gpus, duration=wall,
        prefix_hit_rate=hit_rate,
    )
    return PlayerReport(summary, results, hits, queries, wall)


def build_workload(args: argparse.Namespace) -> Workload:
    if args.trace:
        return load_trace(args.trace, args.speedup, args.limit)
    if args.scenario:
        return scenario_workload(
            args.scenarios_file, args.scenario, args.limit or 100, args.rate, args.seed,
            args.speedup,
        )
    raise WorkloadError("give --trace or --scenario")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers_agent.sim.player", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", required=True, help="OpenAI base URL (engine or gateway)")
    parser.add_argument("--trace", help="Mooncake .jsonl or Azure .csv trace")
    parser.add_argument("--scenario", help="workload name in scenarios.json")
    parser.add_argument("--scenarios-file", default="../shared/data/scenarios.json")
    parser.add_argument("--rate", type=float, help="scenario arrival rate (req/s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, help="first N requests (scenario: how many)")
    parser.add_argument("--speedup", type=float, default=1.0, help="arrival speed-up factor")
    parser.add_argument("--model", help="model name (default: the first in /v1/models)")
    parser.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    parser.add_argument("--slo-itl-ms", type=float, default=50.0)
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--num-gpus", type=int, default=1, help="for goodput per GPU")
    parser.add_argument("--metrics-url", action="append", default=[],
                        help="an engine's /metrics (repeat for each engine)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    parser.add_argument("--json", dest="json_out", help="write the summary and results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        workload = build_workload(args)
    except (WorkloadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(
        replay(
            workload, args.url, args.slo_ttft_ms, args.slo_itl_ms, args.metrics_url,
            args.model, args.attainment, args.num_gpus, args.timeout,
        )
    )
    print("\n".join(report.lines()))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "summary": report.summary.to_dict(),
                    "results": [r.__dict__ for r in report.results],
                },
                handle,
                indent=1,
            )
    return 0 if report.summary.completed else 1


if __name__ == "__main__":
    sys.exit(main())
