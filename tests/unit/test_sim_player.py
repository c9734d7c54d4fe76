"""The workload player against a tiny fake OpenAI server (aiohttp, loopback).

The real simulated engine server is tested by its own suite; this checks the player's
streaming, timing, metrics parsing and summary without depending on it.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from workers_agent.sim import tokens
from workers_agent.sim.player import main, parse_prefix_counters, replay
from workers_agent.sim.workload import synthetic

METRICS = """# HELP vllm:prefix_cache_queries Prefix cache queries, in queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
# HELP vllm:gpu_prefix_cache_hits old name
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{{engine="0",model_name="m"}} 999999
"""


def make_app(seen: list) -> web.Application:
    counters = {"hits": 0, "queries": 0}

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def completions(request):
        body = await request.json()
        ids = tokens.encode(body["prompt"])
        seen.append((body, ids))
        counters["queries"] += len(ids)
        counters["hits"] += len(ids) // 2
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(0.03)
        for index in range(body["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": f" w{index}", "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.01)
        usage = {"prompt_tokens": len(ids), "completion_tokens": body["max_tokens"],
                 "prompt_tokens_details": {"cached_tokens": len(ids) // 2}}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def metrics(request):
        return web.Response(text=METRICS.format(**counters), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    return app


async def _serve_and(coro_factory, seen):
    runner = web.AppRunner(make_app(seen))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        return await asyncio.wait_for(coro_factory(f"http://127.0.0.1:{port}"), timeout=30)
    finally:
        await runner.cleanup()


def test_player_measures_and_sends_trace_token_ids():
    workload = synthetic({"isl": 64, "osl": 5, "shared_prefix_fraction": 0.5}, 6, 50.0, seed=2)
    seen: list = []
    report = asyncio.run(_serve_and(
        lambda base: replay(workload, base, slo_ttft_ms=500, slo_itl_ms=100,
                            metrics_urls=[f"{base}/metrics"]),
        seen,
    ))
    assert len(seen) == 6
    by_prompt = {tuple(ids) for _, ids in seen}
    expected = {tuple(workload.prompts.token_ids(r)) for r in workload.requests}
    assert by_prompt == expected  # the engine re-tokenises to the trace's ids
    assert all(body["stream"] and body["model"] == "fake-model" for body, _ in seen)
    summary = report.summary
    assert summary.completed == 6 and summary.failed == 0
    assert 20 <= summary.ttft_ms["p50"] < 400
    assert 5 <= summary.itl_ms["p50"] < 100
    assert summary.goodput_rps > 0
    assert summary.prefix_hit_rate == 0.5  # from /metrics deltas, current names only
    assert all(r.output_tokens == 5 and r.cached_tokens == 32 for r in report.results)


def test_player_reports_http_errors():
    workload = synthetic({"isl": 8, "osl": 2}, 2, 100.0)
    report = asyncio.run(_serve_and(
        lambda base: replay(workload, base + "/nope", 500, 100, model="m", request_timeout_s=5),
        [],
    ))
    assert report.summary.failed == 2
    assert all(r.error.startswith("HTTP 404") for r in report.results)


def test_parse_prefix_counters_old_names_only():
    text = (
        "# TYPE vllm:gpu_prefix_cache_hits counter\n"
        'vllm:gpu_prefix_cache_hits_total{engine="0"} 5\n'
        "# TYPE vllm:gpu_prefix_cache_queries counter\n"
        'vllm:gpu_prefix_cache_queries_total{engine="0"} 20\n'
    )
    assert parse_prefix_counters(text) == (5.0, 20.0)


def test_cli_rejects_missing_workload(capsys):
    assert main(["--url", "http://127.0.0.1:9"]) == 2
    assert "give --trace or --scenario" in capsys.readouterr().err
