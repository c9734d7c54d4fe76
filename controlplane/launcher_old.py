"""`make run`: prepare the database, seed the sample fleets and serve pdplane.

Runs with the embedded defaults (SQLite + private Redis) unless DATABASE_URL / REDIS_URL
are set. Prints the URL and an admin login; Ctrl-C stops every child process.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step(message: str) -> None:
    print(f"[pdplane] {message}", flush=True)


def manage(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], check=True, cwd=ROOT)


def ensure_admin(var_dir: Path) -> tuple[str, str]:
    """Create the `admin` superuser once; its password lives in var/admin_password."""
    password_file = var_dir / "admin_password"
    if password_file.exists():
        password = password_file.read_text().strip()
    else:
        password = secrets.token_urlsafe(12)
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    if created or not password_file.exists():
        user.set_password(password)
        user.save()
        password_file.write_text(password)
        password_file.chmod(0o600)
    return "admin", password


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PDPLANE_PORT", "8000")))
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    step("checking configuration (embedded SQLite + Redis unless DATABASE_URL/REDIS_URL set)")
    from django.conf import settings

    var_dir = Path(settings.VAR_DIR)
    step("applying database migrations")
    manage("migrate", "--no-input", "-v", "0")
    step("loading the sample fleets")
    manage("load_sample_fleets")
    username, password = ensure_admin(var_dir)

    children: list[subprocess.Popen] = []
    step(f"starting the web server on http://{args.host}:{args.port}/")
    children.append(
        subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "controlplane.asgi:application",
             "--host", args.host, "--port", str(args.port), "--no-access-log",
             "--log-level", "warning"],
            cwd=ROOT,
        )
    )
    print(
        f"\n  pdplane is running: http://{args.host}:{args.port}/admin/\n"
        f"  login: {username} / {password}\n  Ctrl-C stops everything.\n",
        flush=True,
    )

    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping:
            if any(child.poll() is not None for child in children):
                step("a child process exited; stopping")
                break
            time.sleep(0.5)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        if settings.EMBEDDED_REDIS:
            from controlplane.core import embedded_redis

            embedded_redis.stop(var_dir)
        step("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
