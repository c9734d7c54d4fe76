"""Can this host run the prefill->decode (NIXL) part of the real-engine tier?

Some machines of our CI kind kill the decode engine's worker with SIGILL right after NIXL
logs its transfer plan (issue 15): an instruction that CPU, or its VM, does not execute.
That is a fact about the host, not a regression in pdplane, so it must not fail CI — but it
must never pass silently either, and on a host that *can* run the tier every test still
runs and fails on a real defect. Two checks decide:

- before the P/D tests, :func:`probe_nixl` runs ``nixl_probe.py`` (one tiny two-process
  NIXL READ over UCX, with vLLM's CPU kernels loaded) in the vLLM venv. A death by SIGILL
  there marks the host incapable; any other failure is a real failure (in CI).
- during them, :func:`illegal_instruction_in` reads the engines' logs: a worker that died
  with exit code -4 (SIGILL) marks the host incapable too, for the rest of the run.

Either way the reason — with the CPU model, its AMX/AVX-512 flags and, when the engine
printed one (PYTHONFAULTHANDLER), the Python frame that was running — is printed in the
test summary.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
AMX_STATE_MISSING = 3  # nixl_probe.py's exit code for it (the probe runs in the vLLM venv)
PROBE_TIMEOUT_S = 180
# vLLM's multiproc executor logs a dead worker's exit code; -4 is SIGILL.
SIGILL_IN_LOG = re.compile(r"died unexpectedly \(exit code: -4\)|Fatal Python error: Illegal "
                           r"instruction")
NOTABLE_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                 "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


@dataclass(frozen=True)
class Capability:
    capable: bool
    host_fault: bool  # the host could not execute an instruction: not pdplane's defect
    reason: str


def cpu_summary(cpuinfo: str | None = None) -> str:
    """'<model name>; flags: <the AMX / AVX-512 ones present>' from /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "CPU unknown"
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    present = [flag for flag in NOTABLE_FLAGS if flag in flags]
    name = model.group(1).strip() if model else "CPU unknown"
    return f"{name}; flags: {' '.join(present) or 'none of ' + ', '.join(NOTABLE_FLAGS)}"


def _frames(text: str, limit: int = 3) -> str:
    """The first Python frames faulthandler printed, if any ('File ..., line N in f')."""
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text)
    return "; ".join(f"{Path(path).name}:{line} {func}" for path, line, func in frames[:limit])


def classify_probe(returncode: int, stdout: str, stderr: str) -> Capability:
    """Turn the probe's exit into a verdict (pure, so it is tested without a vLLM venv)."""
    if returncode == 0:
        try:
            result = json.loads(stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            result = {}
        if result.get("ok"):
            return Capability(True, False, f"NIXL probe moved {result.get('bytes')} bytes in "
                                           f"{result.get('transfer_ms')} ms")
        return Capability(False, False, f"NIXL probe exited 0 without a result: {stdout[-300:]}")
    if returncode == AMX_STATE_MISSING:
        return Capability(False, True, (
            f"no AMX tile-data permission on {cpu_summary()} (the kernel refused "
            "ARCH_REQ_XCOMP_PERM): vLLM's AMX attention would die of SIGILL on the decode side"))
    sigill = returncode == -signal.SIGILL or "exited with -4" in stderr
    if sigill:
        side = "decode side" if returncode == -signal.SIGILL else "prefill side"
        where = _frames(stderr)
        return Capability(False, True, (
            f"illegal instruction (SIGILL) in the NIXL probe's {side} on {cpu_summary()}"
            + (f"; faulting Python frame: {where}" if where else "")))
    if returncode < 0:
        return Capability(False, False, f"NIXL probe killed by signal {-returncode}: "
                                        f"{stderr[-600:]}")
    return Capability(False, False, f"NIXL probe failed (exit {returncode}): {stderr[-600:]}")


def probe_nixl(python: Path, env: dict[str, str]) -> Capability:
    try:
        proc = subprocess.run([str(python), str(HERE / "nixl_probe.py")], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Capability(False, False, f"NIXL probe did not finish in {PROBE_TIMEOUT_S}s")
    return classify_probe(proc.returncode, proc.stdout, proc.stderr)


def illegal_instruction_in(log_text: str) -> str | None:
    """The reason to report when an engine log shows a worker killed by SIGILL, else None."""
    match = SIGILL_IN_LOG.search(log_text)
    if not match:
        return None
    where = _frames(log_text[match.start() - 4000 : match.end() + 4000])
    return (f"a vLLM worker died of SIGILL (illegal instruction) on {cpu_summary()}"
            + (f"; faulting Python frame: {where}" if where else ""))
