"""`manage.py seed_demo_fleet`: the compose stack's seed, with the fleet on another host."""

import io
import json
import stat

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from controlplane.launcher import demo
from controlplane.telemetry.tokens import hash_token
from controlplane.topology.models import Gateway, Node, Worker

pytestmark = pytest.mark.django_db


def _seed(state_dir, tmp_path, **extra):
    secret = tmp_path / "gateway_secret"
    secret.write_text("compose-gateway-secret-0123456789\n")
    password = tmp_path / "admin_password"
    password.write_text("admin-pass-9876\n")
    args = ["seed_demo_fleet", "--state-dir", str(state_dir), "--fleet-host", "fleet",
            "--gateway-url", "http://gateway:8080", "--gateway-secret-file", str(secret),
            "--admin-password-file", str(password)]
    for key, value in extra.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_topology_points_at_the_fleet_and_gateway_containers(tmp_path):
    state = tmp_path / "state"
    _seed(state, tmp_path)

    workers = Worker.objects.filter(node__cluster__name=demo.CLUSTER)
    assert workers.count() == len(demo.NODES) * demo.GPUS_PER_NODE
    for worker in workers:
        assert worker.api_url.startswith("http://fleet:181")
        assert worker.metrics_url == worker.api_url + "/metrics"
        assert worker.kv_events_endpoint.startswith("tcp://fleet:181")
        assert worker.kv_replay_endpoint.startswith("tcp://fleet:181")
    gateway = Gateway.objects.get(cluster__name=demo.CLUSTER, name=demo.GATEWAY_NAME)
    assert gateway.url == "http://gateway:8080"
    assert gateway.secret == "compose-gateway-secret-0123456789"

    fleet = json.loads((state / "demo" / "fleet.json").read_text())
    assert fleet["host"] == "fleet"
    assert [n["telemetry_port"] for n in fleet["nodes"]] == [18100, 18125, 18150]

    for host in demo.NODES:
        token_file = state / "demo" / f"{host}.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        node = Node.objects.get(cluster__name=demo.CLUSTER, hostname=host)
        assert node.agent_token_hash == hash_token(token_file.read_text().strip())
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("admin-pass-9876")


def test_a_second_run_keeps_tokens_and_rows(tmp_path):
    state = tmp_path / "state"
    _seed(state, tmp_path)
    tokens = {h: (state / "demo" / f"{h}.token").read_text() for h in demo.NODES}
    worker_ids = sorted(Worker.objects.values_list("id", flat=True))

    _seed(state, tmp_path)

    assert tokens == {h: (state / "demo" / f"{h}.token").read_text() for h in demo.NODES}
    assert worker_ids == sorted(Worker.objects.values_list("id", flat=True))
    assert not Worker.objects.filter(api_url__contains="127.0.0.1").exists()


def test_other_ports_follow_the_base_port(tmp_path):
    state = tmp_path / "state"
    _seed(state, tmp_path, base_port=28100)
    fleet = json.loads((state / "demo" / "fleet.json").read_text())
    assert fleet["nodes"][0]["telemetry_port"] == 28100
    assert Worker.objects.filter(api_url="http://fleet:28101").count() == 1


def test_missing_secret_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="gateway secret"):
        call_command("seed_demo_fleet", "--state-dir", str(tmp_path / "s"),
                     "--gateway-secret-file", str(tmp_path / "nope"), stdout=io.StringIO())
