"""`manage.py export_sim_fleet` turns a cluster's topology into a pdplane-sim fleet config."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from workers_agent.sim.fleetconfig import parse_fleet_config

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def export(*args) -> dict:
    out = io.StringIO()
    call_command("export_sim_fleet", *args, stdout=out)
    return json.loads(out.getvalue())


def test_export_sample_cluster_round_trips_through_the_fleet_parser():
    call_command("load_sample_fleets", stdout=io.StringIO())
    data = export("--cluster", "four-h200nvl-servers", "--base-port", "21000")
    config = parse_fleet_config(data)
    assert [n.hostname for n in config.nodes] == [f"h200nvl-{i:02d}" for i in range(1, 5)]
    node = config.nodes[0]
    assert (node.gpu, node.gpu_count, node.nvlink_group_size) == ("H200 NVL", 8, 4)
    assert node.nics[0].line_rate_gbps == 400 and node.nics[0].rdma
    assert len(config.engines) == 32
    engine = config.engines[0]
    assert engine.id == "engine-0" and engine.model == "llama-3.3-70b-fp8"
    assert engine.model_name == "llama-3.3-70b-fp8" and engine.gpus == (0,)
    ports = [node.telemetry_port for node in config.nodes]
    ports += [p for e in config.engines for p in (e.http_port, e.kv_events_port, e.kv_replay_port)]
    assert len(set(ports)) == len(ports) and min(ports) == 21000

    rtx = parse_fleet_config(export("--cluster", "two-rtxpro-servers"))
    assert rtx.nodes[0].gpu == "RTX PRO 6000" and rtx.nodes[0].nvlink_group_size == 0
    assert not rtx.nodes[0].nics[0].rdma
    assert all(e.http_port == 0 for e in rtx.engines)


def test_export_unknown_cluster_is_an_error():
    with pytest.raises(CommandError, match="no cluster"):
        call_command("export_sim_fleet", "--cluster", "nope", stdout=io.StringIO())
