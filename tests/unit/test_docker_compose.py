"""Static checks of docker/: the compose file's structure, the image, the env example.

No Docker engine runs where the suite runs, so `docker compose config` cannot be called
here; these checks parse the files (PyYAML resolves the anchors and merge keys the way
Compose does) and hold them to what docs/operations.md promises.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
SETTINGS_SOURCES = [ROOT / "controlplane" / "settings.py",
                    ROOT / "controlplane" / "alerts" / "conf.py"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _command(service: dict) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def _is_beat(service: dict) -> bool:
    command = _command(service)
    return "celery" in command and "beat" in command


def test_every_service_has_an_image_or_build(services):
    for name, service in services.items():
        assert service.get("image") or service.get("build"), name


def test_pdplane_services_build_the_repository_dockerfile(services):
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file(), name


def test_third_party_images_are_pinned(services):
    for name in ("postgres", "redis", "prometheus", "proxy"):
        image = services[name]["image"]
        assert ":" in image, f"{name}: {image} has no tag"
        tag = image.rsplit(":", 1)[1]
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image}"


def test_exactly_one_beat(services):
    beats = [name for name, service in services.items() if _is_beat(service)]
    assert beats == ["beat"]
    beat = services["beat"]
    assert beat.get("deploy", {}).get("replicas", 1) == 1


def test_the_stack_has_every_part(services):
    commands = {name: " ".join(_command(s)) for name, s in services.items()}
    assert "celery -A controlplane worker" in commands["worker"]
    assert commands["web"].startswith("uvicorn controlplane.asgi:application")
    assert "manage.py migrate" in commands["migrate"]
    assert "manage.py seed_demo_fleet" in commands["seed"]
    assert commands["gateway"].startswith("python -m gateway")
    assert commands["fleet"].startswith("python -m workers_agent.sim.cli run")
    agents = [n for n, c in commands.items() if c.startswith("python -m workers_agent.cli")]
    assert len(agents) == 3
    assert {"postgres", "redis", "prometheus", "proxy", "traffic"} <= set(services)


def test_agents_match_the_seeded_nodes_and_simulator_ports(services):
    from controlplane.launcher import demo

    ports = demo.DemoPorts(web=8000, gateway=8080, base=18100)
    for i, host in enumerate(demo.NODES):
        command = _command(services[f"agent-{i + 1}"])
        assert command[command.index("--hostname") + 1] == host
        assert command[command.index("--token-file") + 1].endswith(f"/demo/{host}.token")
        assert command[command.index("--sim-node-url") + 1] == (
            f"http://fleet:{ports.telemetry(i)}")
    assert services["fleet"]["hostname"] == "fleet"


def test_long_running_services_have_healthchecks_or_say_why_not(services):
    """Healthy-gated start-up order needs real checks on what others wait for."""
    for name in ("postgres", "redis", "web", "proxy", "gateway", "fleet", "prometheus",
                 "worker"):
        check = services[name].get("healthcheck")
        assert check and not check.get("disable") and check.get("test"), name
    # Health of the web process is /healthz (also the image's HEALTHCHECK).
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])


def test_dependencies_exist_and_start_in_order(services):
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            condition = spec.get("condition")
            if condition == "service_healthy":
                check = services[dep].get("healthcheck") or {}
                assert check.get("test") and not check.get("disable"), f"{name} → {dep}"
            if condition == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} must be one-shot"
    for name in ("web", "worker", "beat", "seed"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name


def test_env_files_exist_and_optional_ones_are_marked(services):
    for name, service in services.items():
        for entry in service.get("env_file") or []:
            path = entry if isinstance(entry, str) else entry["path"]
            required = True if isinstance(entry, str) else entry.get("required", True)
            if required:
                assert (DOCKER / path).is_file(), f"{name}: {path}"


def test_secrets_are_declared_files_and_made_by_the_script(compose, services):
    declared = compose["secrets"]
    script = (DOCKER / "make-secrets.sh").read_text()
    for name, spec in declared.items():
        assert spec["file"].startswith("./secrets/"), name
        assert f"put {name} " in script, f"make-secrets.sh does not create {name}"
    for name, service in services.items():
        for secret in service.get("secrets") or []:
            assert secret in declared, f"{name} uses undeclared secret {secret}"
    # No credential is written inline in the compose file.
    text = COMPOSE.read_text()
    assert not re.search(r"(PASSWORD|SECRET_KEY|TOKEN)\s*[:=]\s*[\"']?\w{8,}", text)


def test_env_example_sets_credentials_from_files_and_names_real_settings():
    text = (DOCKER / "pdplane.env.example").read_text()
    assigned = dict(
        line.split("=", 1) for line in text.splitlines()
        if line and not line.startswith("#")
    )
    for name in ("DATABASE_URL_FILE", "SECRET_KEY_FILE", "METRICS_TOKEN_FILE", "REDIS_URL",
                 "ALLOWED_HOSTS", "PROMETHEUS_URL"):
        assert name in assigned, name
    assert "SECRET_KEY" not in assigned and "DATABASE_URL" not in assigned
    mentioned = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", text, re.M))
    sources = "".join(p.read_text() for p in SETTINGS_SOURCES)
    for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS",
                 "CSRF_TRUSTED_ORIGINS", "METRICS_TOKEN", "PROMETHEUS_URL", "DEBUG",
                 "LOG_LEVEL", "TIME_ZONE", "AUDIT_RETENTION_DAYS", "ALERTS_WEBHOOK_ALLOW"):
        assert f'"{name}"' in sources, f"{name} is not a setting any more"
        assert name in mentioned or f"{name}_FILE" in mentioned, f"{name} undocumented"


def test_env_example_is_valid_for_the_settings_parser(tmp_path):
    """The uncommented values parse with the same strict helpers settings.py uses."""
    from controlplane.core import envconfig as ec

    env = dict(
        line.split("=", 1) for line in (DOCKER / "pdplane.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert ec.env_url(env, "REDIS_URL", ec.REDIS_SCHEMES)
    assert ec.env_url(env, "PROMETHEUS_URL", {"http", "https"})
    hosts = ec.env_list(env, "ALLOWED_HOSTS", [])
    # The names the gateway, the agents and Prometheus use inside the compose network.
    assert {"web", "proxy"} <= set(hosts)


def test_prometheus_discovers_targets_from_pdplane_with_the_metrics_token():
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    sd = jobs["pdplane-fleet"]["http_sd_configs"][0]
    assert sd["url"].endswith("/api/v1/prometheus/targets")
    assert sd["authorization"]["credentials_file"] == "/run/secrets/metrics_token"
    assert jobs["pdplane"]["authorization"]["credentials_file"] == "/run/secrets/metrics_token"


def test_dockerfile_is_multistage_non_root_with_healthcheck():
    text = (DOCKER / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\w+)", text, re.M)
    assert stages == ["builder", "runtime"]
    assert "python:3.11-slim" in text
    assert re.search(r"pip install '\.\[agent\]'", text)
    runtime = text.split("AS runtime", 1)[1]
    assert re.search(r"^USER pdplane$", runtime, re.M)
    assert "HEALTHCHECK" in runtime and "/healthz" in runtime
    assert "PYTHONPATH=/app" in runtime
    assert "PROMETHEUS_MULTIPROC_DIR=/tmp/" in runtime
    for path in ("manage.py", "controlplane", "workers_agent", "gateway", "templates",
                 "static"):
        assert re.search(rf"^COPY .*\b{path}\b", runtime, re.M), path
        assert (ROOT / path).exists(), path
    assert '"controlplane.asgi:application"' in runtime and '"0.0.0.0"' in runtime


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in (".venv", "var", ".git", "test-artifacts", "docker/secrets"):
        assert path in ignored, path
