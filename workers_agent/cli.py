"""``pdplane-agent``: the per-node agent.

    pdplane-agent --config /etc/pdplane/agent.toml
    pdplane-agent --server ws://cp:8000/ws/agent/v1/ --token-file agent.token \
                  --sim-node-url http://127.0.0.1:9100
    pdplane-agent --config agent.toml --once     # print one report and exit (no server)

Settings come from the config file (TOML, or JSON by extension), then PDPLANE_AGENT_*
environment variables, then flags. See workers_agent/config.py and docs/agent-protocol.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys

from .config import ConfigError, load


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdplane-agent", description=__doc__.split("\n")[1])
    p.add_argument("--config", help="TOML or JSON config file (or PDPLANE_AGENT_CONFIG)")
    p.add_argument("--server", help="ws(s)://…/ws/agent/v1/")
    p.add_argument("--token-file", dest="token_file")
    p.add_argument("--hostname")
    p.add_argument("--sim-node-url", dest="sim_node_url",
                   help="read GPUs, NICs and engines from a simulated node")
    p.add_argument("--report-interval", dest="report_interval_s", type=float,
                   help="seconds between reports (default: the server's)")
    p.add_argument("--log-level", dest="log_level")
    p.add_argument("--metrics-port", dest="metrics_port", type=int,
                   help="serve the agent's own /metrics on this port (default: off)")
    p.add_argument("--once", action="store_true",
                   help="collect one report, print hello and report as JSON, exit")
    return p


async def _run(cfg) -> int:
    from .agent import Agent
    from .transport import AgentTransport

    agent = Agent(cfg)
    if cfg.metrics_port:
        from .metrics import serve

        serve(agent, cfg.metrics_port, cfg.metrics_addr)
    transport = AgentTransport(cfg, agent)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, transport.stop)
    try:
        await transport.run()
    finally:
        agent.close()
    return 0


def _once(cfg) -> int:
    import time

    from .agent import Agent

    agent = Agent(cfg)
    try:
        hello = agent.hello()
        agent.collect()
        time.sleep(1.0)
        report = agent.collect()
        print(json.dumps({"hello": hello, "report": report}, indent=2))
    finally:
        agent.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k not in {"config", "once"}}
    if args.once:
        overrides.setdefault("server", None)
    try:
        if args.once:
            import os

            env = dict(os.environ)
            env.setdefault("PDPLANE_AGENT_SERVER", "ws://unused/ws/agent/v1/")
            env.setdefault("PDPLANE_AGENT_TOKEN", "unused")
            cfg = load(args.config, env, overrides)
        else:
            cfg = load(args.config, None, overrides)
    except ConfigError as exc:
        print(f"pdplane-agent: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.once:
        return _once(cfg)
    return asyncio.run(_run(cfg))


if __name__ == "__main__":
    sys.exit(main())
