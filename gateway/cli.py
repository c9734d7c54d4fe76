"""``pdplane-gateway`` / ``python -m gateway``: run the reference gateway.

Examples::

    python -m gateway --port 8080 --table table.json --admin-secret s3cret
    python -m gateway --config gateway.toml
    python -m gateway --port 8080 --table table.json --workers 2   # two processes, one port
    PDPLANE_GATEWAY_SECRET=… python -m gateway --control-plane http://cp:8000 \
        --cluster c1 --gateway-name gw1 --state-file /var/lib/pdplane/table.json
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

from aiohttp import web

from . import front
from .app import create_app
from .config import GatewayConfigError, build_config, load_file
from .statictable import parse_worker_flag, static_table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pdplane-gateway", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="JSON or TOML file with any of the settings below")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--admin-secret", help="HMAC secret (prefer PDPLANE_GATEWAY_SECRET)")
    p.add_argument("--admin-secret-file")
    p.add_argument("--table", dest="table_file", help="routing table JSON to start with")
    p.add_argument("--state-file", help="where the last good table is kept across restarts")
    p.add_argument("--control-plane", dest="control_plane_url",
                   help="pdplane base URL to pull the table from")
    p.add_argument("--cluster")
    p.add_argument("--gateway-name")
    p.add_argument("--pull-interval", dest="pull_interval_s", type=float)
    p.add_argument("--request-timeout", dest="request_timeout_s", type=float)
    p.add_argument("--no-kv-events", dest="kv_events", action="store_const", const=False)
    p.add_argument("--kv-stall", dest="kv_stall_s", type=float,
                   help="seconds without KV events after work was sent before a worker's "
                   "stream counts as stalled (default 15)")
    p.add_argument("--tokenize-via-engine", dest="tokenize_via_engine", action="store_const",
                   const=True, help="tokenise text prompts with a worker's /tokenize for exact "
                   "prefix matching against KV events")
    p.add_argument("--no-retry", dest="retry_before_first_byte", action="store_const",
                   const=False)
    p.add_argument("--worker", action="append", default=[], metavar="URL[=ROLE]",
                   help="serve a static table of these workers (with --model; no control "
                   "plane needed); ROLE is prefill, decode or both")
    p.add_argument("--model", help="model name for --worker")
    p.add_argument("--mode", choices=["aggregated", "disaggregated", "conditional"],
                   help="mode for --worker (default: conditional if a prefill worker is "
                   "given, else aggregated)")
    p.add_argument("--local-prefill-max-tokens", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--workers", type=int,
                   help="gateway processes sharing the port (SO_REUSEPORT) and their load "
                   "and prefix knowledge (default 1)")
    p.add_argument("--seed", type=int)
    p.add_argument("--log-level")
    p.add_argument("--access-log", action="store_const", const=True)
    p.add_argument("--server", choices=["lean", "aiohttp"],
                   help="HTTP server: the gateway's own (lean, default) or aiohttp's")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    static = {"config", "worker", "model", "mode", "local_prefill_max_tokens", "block_size"}
    overrides = {k: v for k, v in vars(args).items() if k not in static and v is not None}
    try:
        file_values = load_file(args.config) if args.config else {}
        config = build_config(file_values, overrides)
        table = _static_table(args)
    except (GatewayConfigError, ValueError) as exc:
        print(f"pdplane-gateway: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if config.workers > 1:
        index = os.environ.get(WORKER_INDEX_ENV)
        if index is None:
            return _supervise(config.workers, sys.argv[1:] if argv is None else argv)
        config.worker_index = int(index)
        config.validate()
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is optional
        pass
    gateway, app = create_app(config)
    if table is not None:
        result = gateway.store.apply(table)
        if result.outcome != "ack":
            print(f"pdplane-gateway: static table refused: {result.error}", file=sys.stderr)
            return 2
    if config.server == "lean":
        front.run(gateway, config)
        return 0
    web.run_app(
        app,
        host=config.host,
        port=config.port,
        access_log=logging.getLogger("gateway.access") if config.access_log else None,
        handler_cancellation=True,  # a client that disconnects cancels the upstream call
        reuse_port=config.workers > 1 or None,
        print=lambda *a: logging.getLogger("gateway").warning(
            "pdplane gateway listening on http://%s:%d", config.host, config.port
        ),
    )
    return 0


WORKER_INDEX_ENV = "PDPLANE_GATEWAY_WORKER_INDEX"


def _supervise(count: int, argv: list[str]) -> int:
    """Run ``count`` gateway processes with the same arguments on one port; stop them all
    when told to stop or when one of them dies."""
    children = [
        subprocess.Popen([sys.executable, "-m", "gateway", *argv],
                         env={**os.environ, WORKER_INDEX_ENV: str(i)})
        for i in range(count)
    ]

    def stop(*_):
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while all(child.poll() is None for child in children):
            time.sleep(0.2)
    finally:
        stop()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
    return max((child.returncode or 0) for child in children)


def _static_table(args: argparse.Namespace) -> dict | None:
    if not args.worker:
        if args.model or args.mode:
            raise ValueError("--model and --mode need at least one --worker")
        return None
    if not args.model:
        raise ValueError("--worker needs --model")
    workers = [parse_worker_flag(w) for w in args.worker]
    return static_table(args.model, workers, mode=args.mode, block_size=args.block_size,
                        local_prefill_max_tokens=args.local_prefill_max_tokens)


if __name__ == "__main__":
    raise SystemExit(main())
