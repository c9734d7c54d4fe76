"""Can this host move KV bytes the way the P/D tests do? One tiny NIXL transfer, in the vLLM
venv, run by conftest.py before the prefill->decode tests.

Two processes, as in the real pair: a "prefill" agent registers a CPU tensor, a "decode"
agent in another process adds it as a remote agent (the step after which the decode
engine's worker died with SIGILL on some hosts: issue 15) and READs it over UCX with the
same transport settings the engines get. Both load vLLM's CPU kernels first, as an engine
worker does. Exit 0 and one JSON line on stdout when the bytes arrived intact; anything
else is a failure, and a death by signal is reported by the caller as a host fault.

The decode side also checks the fault that issue 15 turned out to be: on a CPU that
advertises AMX, the process must hold the kernel's tile-data permission before vLLM's AMX
attention runs (engine_site/sitecustomize.py asks for it). Without it the probe exits
``AMX_STATE_MISSING`` — the one-token decode step of a real decode engine would die of SIGILL.

Run: ``<vllm venv>/bin/python nixl_probe.py`` (no arguments).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

SIZE = 4096
TIMEOUT_S = 60.0
AMX_STATE_MISSING = 3  # exit code: AMX advertised, tile-data permission not held
XFEATURE_XTILEDATA = 18


def amx_tile_state() -> str:
    """'not advertised', 'granted' or 'missing' for this process (Linux x86_64)."""
    import ctypes
    import platform

    try:
        with open("/proc/cpuinfo") as cpuinfo:
            advertised = " amx_tile" in cpuinfo.read()
    except OSError:
        advertised = False
    if not advertised or sys.platform != "linux" or platform.machine() != "x86_64":
        return "not advertised"
    permitted = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    # arch_prctl(ARCH_GET_XCOMP_PERM, &mask): the extended states this process may use.
    if libc.syscall(158, 0x1022, ctypes.byref(permitted)) != 0:
        return "missing"
    return "granted" if permitted.value >> XFEATURE_XTILEDATA & 1 else "missing"


def _load_engine_kernels() -> None:
    # The same shared objects a vLLM CPU worker has mapped when it meets NIXL.
    from vllm.platforms import current_platform

    current_platform.import_kernels()


def _prefill_side(to_decode, from_decode) -> None:
    import torch
    from nixl._api import nixl_agent, nixl_agent_config

    _load_engine_kernels()
    agent = nixl_agent("probe-prefill", nixl_agent_config(backends=["UCX"]))
    source = torch.arange(SIZE, dtype=torch.uint8)
    agent.register_memory(source)
    to_decode.put((agent.get_agent_metadata(), agent.get_serialized_descs(
        agent.get_xfer_descs(source))))
    # Stay alive (and keep the memory registered) until the reader is done.
    from_decode.get(timeout=TIMEOUT_S)


def _decode_side(from_prefill, to_prefill) -> dict:
    import torch
    from nixl._api import nixl_agent, nixl_agent_config

    _load_engine_kernels()
    amx = amx_tile_state()
    if amx == "missing":
        to_prefill.put("done")
        raise AmxStateMissing
    agent = nixl_agent("probe-decode", nixl_agent_config(backends=["UCX"]))
    target = torch.zeros(SIZE, dtype=torch.uint8)
    agent.register_memory(target)
    metadata, serialized = from_prefill.get(timeout=TIMEOUT_S)
    remote = agent.add_remote_agent(metadata)
    remote_descs = agent.deserialize_descs(serialized)
    started = time.monotonic()
    handle = agent.initialize_xfer("READ", agent.get_xfer_descs(target), remote_descs, remote,
                                   b"probe")
    state = agent.transfer(handle)
    while state == "PROC" and time.monotonic() - started < TIMEOUT_S:
        time.sleep(0.01)
        state = agent.check_xfer_state(handle)
    to_prefill.put("done")
    if state != "DONE":
        raise RuntimeError(f"NIXL transfer ended in state {state!r}")
    expected = torch.arange(SIZE, dtype=torch.uint8)
    if not torch.equal(target, expected):
        raise RuntimeError("NIXL transfer completed but the bytes differ")
    return {"ok": True, "bytes": SIZE, "transfer_ms": round((time.monotonic() - started) * 1e3, 2),
            "amx_tile_state": amx}


class AmxStateMissing(Exception):
    pass


def main() -> int:
    os.environ.setdefault("UCX_TLS", "tcp,self,sm")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    ctx = mp.get_context("spawn")  # vLLM's workers are spawned too: nothing inherited
    to_decode, to_prefill = ctx.Queue(), ctx.Queue()
    prefill = ctx.Process(target=_prefill_side, args=(to_decode, to_prefill), daemon=True)
    prefill.start()
    try:
        result = _decode_side(to_decode, to_prefill)
    except AmxStateMissing:
        print("this CPU advertises AMX (amx_tile) but the process holds no AMX tile-data "
              "permission (arch_prctl ARCH_REQ_XCOMP_PERM): vLLM's AMX attention would die "
              "of SIGILL in a decode engine's first step", file=sys.stderr, flush=True)
        return AMX_STATE_MISSING
    finally:
        prefill.join(timeout=10)
        if prefill.is_alive():
            prefill.kill()
    if prefill.exitcode not in (0, None):
        raise RuntimeError(f"the prefill-side process exited with {prefill.exitcode}")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
