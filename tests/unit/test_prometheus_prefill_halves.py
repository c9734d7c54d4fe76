"""The request rate and answer lengths from Prometheus count each request once (issue 16,
the fleet figures' counting rule): mid-move a "both" engine's prefill halves of requests
decoded elsewhere are taken out, as the agents' path does
(controlplane.telemetry.histograms.without_prefill_halves). The queries are evaluated by
Prometheus's own engine (``promtool test rules``) on synthetic series."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from controlplane.observability.promread import FleetLatencyReader

PROMTOOL = shutil.which("promtool")
WINDOW_S = 300.0


def _series(engine: str, role: str, success: float, gen: dict[str, float], gen_sum: float):
    """One engine's counters growing at the given rates per second (1 m samples)."""
    sel = f'model_name="m",engine="{engine}",role="{role}"'
    out = [(f'vllm:request_success_total{{{sel},finished_reason="stop"}}', success)]
    out += [(f'vllm:request_generation_tokens_bucket{{{sel},le="{le}"}}', v)
            for le, v in gen.items()]
    out += [(f"vllm:request_generation_tokens_sum{{{sel}}}", gen_sum),
            (f"vllm:request_generation_tokens_count{{{sel}}}", gen["+Inf"])]
    return out


def _evaluate(tmp_path, series, queries: dict[str, str]) -> dict[str, float | None]:
    """Each query's value at 10 m: promtool is told to expect a sentinel and its failure
    message says what it got. The test file is JSON (YAML's subset: no quoting to get
    wrong)."""
    got = {}
    for key, query in queries.items():
        test = {"evaluation_interval": "1m", "tests": [{
            "interval": "1m",
            "input_series": [{"series": name, "values": f"0+{rate * 60:g}x20"}
                             for name, rate in series],
            "promql_expr_test": [{"expr": query, "eval_time": "10m",
                                  "exp_samples": [{"labels": "{}", "value": -12345}]}],
        }]}
        path = tmp_path / f"{key}.yml"
        path.write_text(json.dumps(test))
        run = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True,
                             text=True, timeout=60)
        text = run.stdout + run.stderr
        assert "got:" in text, text
        found = re.search(r"got:\s*\{\}\s*([-+0-9.eE]+|NaN)", text)
        got[key] = float(found.group(1)) if found else None
    return got


def _queries(reader: FleetLatencyReader) -> dict[str, str]:
    """The reader's decode-side queries, as it would send them."""
    asked = []

    def scalar(query):
        asked.append(query)
        return 1.0

    reader._scalar = scalar
    reader.engine_stats("m", WINDOW_S)
    pick = {
        "requests": "vllm:request_success_total{model_name=\"m\",role=~\"decode|both\"}",
        "gen_sum": "vllm:request_generation_tokens_sum",
        "gen_count": "vllm:request_generation_tokens_count",
    }
    out = {k: next(q for q in asked if needle in q) for k, needle in pick.items()}
    out["gen_p50"] = next(q for q in asked if "histogram_quantile(0.5" in q
                          and "request_generation_tokens_bucket" in q)
    return out


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_mid_move_prefill_halves_on_both_engines_are_counted_once(tmp_path):
    # P prefills 1 req/s for D; B serves 0.5 req/s itself (50-token answers) and prefills
    # 0.5 req/s more for D; D decodes 1.5 req/s (50-token answers). 2 requests a second.
    series = (
        _series("p", "prefill", 1.0, {"1.0": 1.0, "100.0": 1.0, "+Inf": 1.0}, 1.0)
        + _series("b", "both", 1.0, {"1.0": 0.5, "100.0": 1.0, "+Inf": 1.0}, 0.5 + 25.0)
        + _series("d", "decode", 1.5, {"1.0": 0.0, "100.0": 1.5, "+Inf": 1.5}, 75.0)
    )
    got = _evaluate(tmp_path, series, _queries(FleetLatencyReader("http://127.0.0.1:9")))
    assert got["requests"] == pytest.approx(2.0)  # 2.5 before: B's halves counted twice
    assert got["gen_sum"] / got["gen_count"] == pytest.approx(50.0)  # 40.2 before
    # Every answer is in (1, 100]: the median interpolates to its middle (38.1 before).
    assert got["gen_p50"] == pytest.approx(50.5)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_aggregated_one_token_answers_are_real_and_stay(tmp_path):
    series = (_series("b0", "both", 1.0, {"1.0": 0.5, "100.0": 1.0, "+Inf": 1.0}, 25.5)
              + _series("b1", "both", 1.0, {"1.0": 0.0, "100.0": 1.0, "+Inf": 1.0}, 50.0))
    got = _evaluate(tmp_path, series, _queries(FleetLatencyReader("http://127.0.0.1:9")))
    assert got["requests"] == pytest.approx(2.0)
    assert got["gen_sum"] / got["gen_count"] == pytest.approx(75.5 / 2)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_without_role_labels_every_engine_counts(tmp_path):
    series = [(n.replace(',role="both"', ""), r) for n, r in
              _series("x", "both", 3.0, {"1.0": 0.0, "100.0": 3.0, "+Inf": 3.0}, 30.0)]
    got = _evaluate(tmp_path, series, _queries(FleetLatencyReader("http://127.0.0.1:9")))
    assert got["requests"] == pytest.approx(3.0)
