"""A real ASGI server (uvicorn) on the test database, and headless Chromium (Playwright)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import (
    ROOT,
    START_S,
    free_port,
    python_env,
    require_system_part,
    stop_process,
    wait_for_port,
)

# How long a step waits for the page (navigation, a selector, a live update). An upper bound,
# not a speed goal: with two test runs on a 2-core box, a login page took over 15 s to load.
WAIT_MS = 45_000
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]


def _database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("browser tests run against PostgreSQL")
    user = db.get("USER") or "postgres"
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


@pytest.fixture
def asgi_server(transactional_db, tmp_path):
    """uvicorn serving controlplane.asgi on a free port, against the test database."""
    port = free_port()
    env = python_env(DATABASE_URL=_database_url(), PDPLANE_VAR_DIR=str(tmp_path),
                     ALLOWED_HOSTS="127.0.0.1,localhost")
    log = open(tmp_path / "uvicorn.log", "w")  # noqa: SIM115 - closed in teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, timeout=START_S, process=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture(scope="module")
def browser():
    """One Chromium per module. Not per session: Playwright's sync API keeps an event loop
    running in this thread while it is open, and later tests need asyncio.run()."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if not executable:
        require_system_part("browser", "chromium is not installed",
                            "apt-get install chromium (Debian's; never `playwright install`)")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    yield page
    context.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def login(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/?next=/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(f"{base_url}/")


@pytest.fixture(autouse=True)
def _orm_beside_playwright(monkeypatch):
    # Playwright's sync API keeps an event loop alive in this thread, and Django refuses ORM
    # calls when it sees one. The test's own ORM use is ordinary synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
