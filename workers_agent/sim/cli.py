"""``pdplane-sim``: run a simulated fleet of vLLM-compatible engines.

    pdplane-sim run --config fleet.json [--endpoints-out endpoints.json] [--in-process]
                    [--time-scale 0.1] [--kv-batch-format array|map]
    pdplane-sim example-config [--nodes 2] [--gpu H200] [--model llama-3.3-70b-fp8]
    pdplane-sim node --config resolved.json --node HOST   (internal: one node process)
    pdplane-sim play ...                                  (the workload player, if present)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace

from workers_agent.sim.fleetconfig import FleetConfigError, load_fleet_config


def example_config(nodes: int = 2, gpu: str = "H200", model: str = "llama-3.3-70b-fp8",
                   gpus_per_node: int = 8, engines_per_node: int = 2) -> dict:
    """A small fleet: ``nodes`` nodes, one NVLink group each, 400G RDMA NICs."""
    fleet_nodes, engines = [], []
    for n in range(nodes):
        host = f"sim-node-{n + 1}"
        fleet_nodes.append({
            "hostname": host, "gpu": gpu, "gpu_count": gpus_per_node,
            "nvlink_group_size": gpus_per_node,
            "nics": [{"name": "mlx5_0", "line_rate_gbps": 400, "transport": "infiniband",
                      "rdma": True}],
            "telemetry_port": 0,
        })
        for e in range(engines_per_node):
            engines.append({
                "id": f"{host}-e{e}", "node": host, "model": model, "gpus": [e],
                "role": "both", "http_port": 0, "kv_events_port": 0, "kv_replay_port": 0,
            })
    return {"time_scale": 1.0, "nodes": fleet_nodes, "engines": engines}


def _play(argv: list[str]) -> int:
    try:
        from workers_agent.sim import player
    except ImportError:
        print("pdplane-sim: the workload player is not available", file=sys.stderr)
        return 2
    entry = getattr(player, "main", None)
    if entry is None:
        print("pdplane-sim: the workload player has no command-line entry", file=sys.stderr)
        return 2
    return int(entry(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "play":
        return _play(argv[1:])
    parser = argparse.ArgumentParser(prog="pdplane-sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start a simulated fleet from a config file")
    run.add_argument("--config", required=True, help="fleet config JSON (docs/sim.md)")
    run.add_argument("--endpoints-out", help="write the endpoints as JSON to this path")
    run.add_argument("--in-process", action="store_true",
                     help="run every node in this process instead of one process per node")
    run.add_argument("--time-scale", type=float,
                     help="override the config's time_scale (0.1 = ten times faster)")
    run.add_argument("--kv-batch-format", choices=("array", "map"), default="array",
                     help="KV-event batch encoding: vLLM 0.32 array (default) or newer map")
    run.add_argument("--log-level", default="WARNING")

    node = sub.add_parser("node", help="(internal) run some nodes of a port-resolved config")
    node.add_argument("--config", required=True)
    node.add_argument("--node", action="append", required=True, dest="nodes")
    node.add_argument("--kv-batch-format", choices=("array", "map"), default="array")
    node.add_argument("--log-level", default="WARNING")

    example = sub.add_parser("example-config", help="print an example fleet config")
    example.add_argument("--nodes", type=int, default=2)
    example.add_argument("--gpu", default="H200")
    example.add_argument("--model", default="llama-3.3-70b-fp8")
    example.add_argument("--gpus-per-node", type=int, default=8)
    example.add_argument("--engines-per-node", type=int, default=2)

    sub.add_parser("play", help="replay a trace against an OpenAI endpoint (see --help there)")

    args = parser.parse_args(argv)
    if args.command == "example-config":
        print(json.dumps(example_config(args.nodes, args.gpu, args.model, args.gpus_per_node,
                                        args.engines_per_node), indent=2))
        return 0

    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_fleet_config(args.config)
    except FleetConfigError as exc:
        print(f"pdplane-sim: invalid fleet config: {exc}", file=sys.stderr)
        return 2

    from workers_agent.sim import launcher

    if args.command == "node":
        unknown = [h for h in args.nodes if h not in {n.hostname for n in config.nodes}]
        if unknown:
            print(f"pdplane-sim: unknown node(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        return launcher.run_node_process(config, args.nodes, kv_batch_format=args.kv_batch_format)

    if args.time_scale is not None:
        if args.time_scale <= 0:
            print("pdplane-sim: --time-scale must be positive", file=sys.stderr)
            return 2
        config = replace(config, time_scale=args.time_scale)
    try:
        from workers_agent.sim import profiles

        for n in config.nodes:
            profiles.get_hardware(n.gpu)
        for e in config.engines:
            profiles.get_model(e.model)
    except KeyError as exc:
        print(f"pdplane-sim: invalid fleet config: {exc}", file=sys.stderr)
        return 2
    return launcher.run_fleet(config, in_process=args.in_process,
                              endpoints_out=args.endpoints_out,
                              kv_batch_format=args.kv_batch_format, log_level=args.log_level)


if __name__ == "__main__":
    sys.exit(main())
