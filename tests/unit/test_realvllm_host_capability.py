"""The P/D tier's host verdicts (tests/realvllm/host_capability.py), without a vLLM venv."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.realvllm import host_capability as hc

INTEL_AMX = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_int8
"""


def test_a_clean_probe_is_capable():
    verdict = hc.classify_probe(0, json.dumps({"ok": True, "bytes": 4096, "transfer_ms": 3.2}), "")
    assert verdict.capable and not verdict.host_fault
    assert "4096 bytes" in verdict.reason


def test_sigill_on_the_decode_side_is_a_host_fault_with_the_frame():
    stderr = ('Fatal Python error: Illegal instruction\n\nThread 0x1 (most recent call first):\n'
              '  File "/v/nixl_cu12/_api.py", line 908 in add_remote_agent\n'
              '  File "/w/nixl_probe.py", line 57 in _decode_side\n')
    verdict = hc.classify_probe(-signal.SIGILL, "", stderr)
    assert not verdict.capable and verdict.host_fault
    assert "decode side" in verdict.reason
    assert "_api.py:908 add_remote_agent" in verdict.reason


def test_sigill_on_the_prefill_side_is_a_host_fault():
    verdict = hc.classify_probe(1, "", "RuntimeError: the prefill-side process exited with -4")
    assert verdict.host_fault and "prefill side" in verdict.reason


def test_other_failures_are_not_excused():
    for code, stderr in ((1, "ImportError: no module named nixl"), (-signal.SIGSEGV, "boom")):
        verdict = hc.classify_probe(code, "", stderr)
        assert not verdict.capable and not verdict.host_fault
    assert not hc.classify_probe(0, "no json here", "").capable


def test_engine_log_with_a_sigill_worker_is_recognised():
    log = ("INFO [base_worker.py:2255] Transfer plan: TransferTopology(tp_ratio=1, ...)\n"
           "ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly "
           "(exit code: -4)\n")
    assert "SIGILL" in hc.illegal_instruction_in(log)
    assert hc.illegal_instruction_in("Worker proc VllmWorker-0 died unexpectedly (exit code: -9)") \
        is None


def test_cpu_summary_names_the_model_and_the_amx_flags():
    summary = hc.cpu_summary(INTEL_AMX)
    assert summary.startswith("Intel(R) Xeon(R) Processor; flags:")
    assert "amx_tile" in summary and "avx512_bf16" in summary and "sse2" not in summary


def test_a_probe_without_the_amx_tile_state_is_a_host_fault():
    verdict = hc.classify_probe(hc.AMX_STATE_MISSING, "", "this CPU advertises AMX ...")
    assert not verdict.capable and verdict.host_fault
    assert "ARCH_REQ_XCOMP_PERM" in verdict.reason and "SIGILL" in verdict.reason


def _amx_state_in_a_fresh_python(with_engine_site: bool) -> str:
    root = Path(__file__).resolve().parents[2]
    path = [str(root)]
    if with_engine_site:
        path.insert(0, str(root / "tests" / "realvllm" / "engine_site"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    code = "from tests.realvllm.nixl_probe import amx_tile_state; print(amx_tile_state())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip()


def test_engine_processes_hold_the_amx_tile_state_from_the_start():
    # The issue-15 SIGILL: a fresh process has no AMX tile-data permission until something
    # asks; the engines' start-up hook asks, so vLLM's AMX attention can run in any order.
    assert _amx_state_in_a_fresh_python(with_engine_site=False) in ("not advertised", "missing")
    assert _amx_state_in_a_fresh_python(with_engine_site=True) in ("not advertised", "granted")
