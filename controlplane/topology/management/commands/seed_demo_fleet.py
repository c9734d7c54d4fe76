"""Seed the demo cluster for a deployment where the simulated fleet runs on another host.

`make run` seeds the demo in-process (``controlplane.launcher.demo.seed``) with everything
on 127.0.0.1. In docker/compose.yaml the simulator, the agents, the gateway and the
control plane are separate containers, so this command runs the same seed and then points
the topology at the names those containers have on the compose network::

    manage.py seed_demo_fleet --state-dir /srv/pdplane-fleet --fleet-host fleet \
        --gateway-url http://gateway:8080 \
        --gateway-secret-file /run/secrets/gateway_secret \
        --admin-password-file /run/secrets/admin_password

It writes ``<state-dir>/demo/``: one agent token per node (``<hostname>.token``, mode
0600), ``gateway.secret`` and ``fleet.json`` (the simulator's config, bound to and
advertising ``--fleet-host``). Idempotent, like the seed it wraps: tokens are kept when
their files exist, so agents keep working across re-runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from controlplane.launcher import demo
from controlplane.topology.models import Gateway, Worker

LOOPBACK = "127.0.0.1"
WORKER_URL_FIELDS = ("api_url", "metrics_url", "kv_events_endpoint", "kv_replay_endpoint")


def _read_secret(path: str | None, what: str) -> str | None:
    if not path:
        return None
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise CommandError(f"cannot read the {what} file {path}: {exc}") from None
    if not value:
        raise CommandError(f"the {what} file {path} is empty")
    return value


def _rehost(url: str, host: str) -> str:
    """``http://127.0.0.1:18101/metrics`` → ``http://fleet:18101/metrics``."""
    for scheme in ("http://", "tcp://"):
        prefix = f"{scheme}{LOOPBACK}:"
        if url.startswith(prefix):
            return f"{scheme}{host}:{url[len(prefix):]}"
    return url


class Command(BaseCommand):
    help = "Seed the demo cluster (3 simulated nodes) for a containerised deployment."

    def add_arguments(self, parser):
        parser.add_argument("--state-dir", required=True,
                            help="shared directory for agent tokens, gateway secret, fleet.json")
        parser.add_argument("--fleet-host", default=LOOPBACK,
                            help="host name the simulated engines bind to and are reached at")
        parser.add_argument("--gateway-url", default="",
                            help="where the control plane pushes routing tables "
                                 "(default http://127.0.0.1:<gateway-port>)")
        parser.add_argument("--web-port", type=int, default=8000)
        parser.add_argument("--gateway-port", type=int, default=8080)
        parser.add_argument("--base-port", type=int, default=18100,
                            help="first simulated port (75 in a row)")
        parser.add_argument("--gateway-secret-file",
                            help="use this HMAC secret for the gateway instead of generating one")
        parser.add_argument("--admin-password-file",
                            help="create the superuser 'admin' with this password if missing")

    def handle(self, *args, **opts):
        state_dir = Path(opts["state_dir"])
        fleet_host = opts["fleet_host"]
        ports = demo.DemoPorts(web=opts["web_port"], gateway=opts["gateway_port"],
                               base=opts["base_port"])
        gateway_url = opts["gateway_url"] or f"http://{LOOPBACK}:{ports.gateway}"
        gateway_secret = _read_secret(opts["gateway_secret_file"], "gateway secret")
        admin_password = _read_secret(opts["admin_password_file"], "admin password")

        secrets_dir = state_dir / "demo"
        try:
            secrets_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot create {secrets_dir}: {exc}") from None
        if gateway_secret:
            # demo.seed keeps an existing secret file; putting the given one there first
            # makes the Gateway row and the gateway process agree on it.
            secret_file = secrets_dir / "gateway.secret"
            secret_file.write_text(gateway_secret)
            os.chmod(secret_file, 0o600)

        with transaction.atomic():
            seeded = demo.seed(ports, state_dir)
            if fleet_host != LOOPBACK:
                self._rehost_topology(fleet_host, gateway_url)
            elif opts["gateway_url"]:
                Gateway.objects.filter(cluster__name=demo.CLUSTER,
                                       name=demo.GATEWAY_NAME).update(url=gateway_url)
            if admin_password:
                self._ensure_admin(admin_password)

        fleet = json.loads(seeded["fleet_file"].read_text())
        fleet["host"] = fleet_host
        seeded["fleet_file"].write_text(json.dumps(fleet, indent=2))

        self.stdout.write(f"demo cluster {demo.CLUSTER!r} seeded; files in {secrets_dir}/")
        for host, token_file in seeded["tokens"].items():
            self.stdout.write(f"  agent token  {host}: {token_file}")
        self.stdout.write(f"  gateway secret: {seeded['gateway_secret_file']}")
        self.stdout.write(f"  fleet config:   {seeded['fleet_file']} (host {fleet_host})")

    def _rehost_topology(self, fleet_host: str, gateway_url: str) -> None:
        workers = Worker.objects.filter(node__cluster__name=demo.CLUSTER)
        for worker in workers:
            changed = []
            for field in WORKER_URL_FIELDS:
                old = getattr(worker, field)
                new = _rehost(old, fleet_host)
                if new != old:
                    setattr(worker, field, new)
                    changed.append(field)
            if changed:
                worker.save(update_fields=changed)
        Gateway.objects.filter(cluster__name=demo.CLUSTER, name=demo.GATEWAY_NAME).update(
            url=gateway_url)

    def _ensure_admin(self, password: str) -> None:
        user, created = get_user_model().objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True})
        if created:
            user.set_password(password)
            user.save()
            self.stdout.write("  superuser 'admin' created (password from the given file)")
