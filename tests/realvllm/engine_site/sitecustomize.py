"""Start-up hook of every Python process in the real-engine tier (conftest.py puts this folder
on the engines' PYTHONPATH): ask Linux for the AMX tile-data state before any kernel uses it.

Why (issue 15, found with a core dump of the dying worker): vLLM 0.32's CPU attention chooses
its AMX kernel from CPUID alone (``_get_attn_isa``: bfloat16 and a block size that is a
multiple of 32) and never requests the state itself. On Linux an AMX instruction in a process
that has not called ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` is delivered as
SIGILL. An engine normally gets the permission by accident: oneDNN requests it the first time
a multi-row bfloat16 matmul runs, in the engine's first prefill. A P/D decode engine's first
forward is a one-token decode over blocks that arrived through NIXL, where no such matmul runs
before attention, so its first tile load (``TileGemm122::gemm``, csrc/cpu/cpu_attn_amx.hpp)
killed the worker on Intel hosts with ``amx_tile``. The permission belongs to the process and
is inherited by fork, so asking once at interpreter start covers the API server, the engine
core and its workers. This is what ``torch.cpu._init_amx()`` does, without importing torch.
"""

import sys


def _request_amx_tile_state() -> None:
    if sys.platform != "linux":
        return
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            if " amx_tile" not in cpuinfo.read():
                return
        import ctypes
        import os
        import platform

        if platform.machine() != "x86_64":
            return
        arch_prctl = 158  # x86_64 syscall number
        arch_req_xcomp_perm, xfeature_xtiledata = 0x1023, 18
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0:
            errno = ctypes.get_errno()
            sys.stderr.write(
                f"pdplane engine_site: the kernel refused the AMX tile-data state "
                f"({os.strerror(errno)}); vLLM's AMX attention will die of SIGILL here\n")
    except Exception as error:  # never stop an engine from starting over a best effort
        sys.stderr.write(f"pdplane engine_site: AMX state request skipped: {error}\n")


_request_amx_tile_state()
