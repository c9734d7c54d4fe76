#!/usr/bin/env bash
# Create (once) the venv that holds the peer routers pdplane is compared with and adapts to
# (vllm-router, sglang-router: Rust binaries shipped as PyPI wheels), and print its bin/.
#
# They are not dependencies of pdplane: the gateway's router adapters are tested against
# the real binaries (tests/integration/gateway/test_gateway_adapters.py) and
# bench/gateway_bench.py runs them side by side. Cached at
# ${PDPLANE_PEERS_VENV:-$HOME/.cache/pdplane-peers}, pinned by scripts/peer-routers.lock;
# a stamp named for the lock's hash makes a second run a no-op.
#
# stdout: exactly one line, the venv's bin folder. Progress goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOCK="$HERE/peer-routers.lock"
VENV=${PDPLANE_PEERS_VENV:-$HOME/.cache/pdplane-peers}
STAMP="$VENV/.pdplane-peers-lock-$(sha1sum "$LOCK" | cut -c1-12)"

if [ -f "$STAMP" ] && [ -x "$VENV/bin/vllm-router" ] && [ -x "$VENV/bin/sglang-router" ]; then
  echo "$VENV/bin"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.build-lock"  # one build at a time on a machine; the waiter finds the stamp
flock 9
if [ -f "$STAMP" ] && [ -x "$VENV/bin/vllm-router" ] && [ -x "$VENV/bin/sglang-router" ]; then
  echo "$VENV/bin"
  exit 0
fi
echo "[peer_routers_env] creating $VENV from $LOCK" >&2
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK" 2>&1 \
  | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
"$VENV/bin/python" -m pip check >&2
rm -f "$VENV"/.pdplane-peers-lock-*
touch "$STAMP"
echo "$VENV/bin"
