"""Keep a vllm-router or sglang-router worker list in sync with a pdplane routing table.

Both Rust routers (PyPI ``vllm-router`` 0.1.x, ``sglang-router`` 0.3.x) can add and remove
workers at run time over HTTP, so the adapter runs beside the router as a sidecar: it reads
the table (from a file, or pulled signed from the control plane like a gateway would), works
out which workers should receive traffic, and makes the router's list match — adding first,
removing after ("make before break", as xDS orders changes).

Worker-management APIs, checked against the installed binaries:

- vllm-router: ``GET /list_workers`` → ``{"urls": [...]}``; ``POST /add_worker?url=U``;
  ``POST /remove_worker?url=U``.
- sglang-router 0.3: ``GET /workers`` → ``{"workers": [{"id", "url", …}]}``;
  ``POST /workers`` with ``{"url": U}`` (202, asynchronous); ``DELETE /workers/{id}``.

What carries over from the table: membership (active workers in; draining, drained and
removed workers out). What does not: weights, temperature, the P/D threshold and KV paths —
those routers have their own policies and flags (``--policy cache_aware``, …). Regular
(aggregated) mode only: workers whose role is ``both`` or ``decode``. Their P/D modes need
prefill/decode lists and bootstrap ports fixed at launch, which this adapter does not manage.

Usage::

    python -m gateway.adapters.router_sync --kind vllm-router --router http://127.0.0.1:30000 \
        --table table.json [--model NAME] [--once | --interval 5]
    PDPLANE_GATEWAY_SECRET=… python -m gateway.adapters.router_sync --kind sglang-router \
        --router http://127.0.0.1:30000 --control-plane http://cp:8000 --cluster c1 \
        --gateway-name sglang-1
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gateway import signing
from gateway.table import TableError, parse

log = logging.getLogger("gateway.adapters.router_sync")
KINDS = ("vllm-router", "sglang-router")


def desired_urls(raw_table: dict[str, Any], model: str | None = None) -> set[str]:
    """URLs that should receive requests: active workers able to serve whole requests."""
    table = parse(raw_table)
    models = [table.models[model]] if model else list(table.models.values())
    return {
        w.url.rstrip("/")
        for m in models
        for w in m.workers
        if w.active and w.role in ("both", "decode")
    }


def plan_sync(desired: set[str], current: set[str]) -> tuple[list[str], list[str]]:
    """(to add, to remove), both sorted; adding is done before removing."""
    return sorted(desired - current), sorted(current - desired)


def _http(method: str, url: str, body: dict | None = None, timeout: float = 5.0):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
    with urllib.request.urlopen(req, timeout=timeout) as response:  # noqa: S310
        raw = response.read()
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {"text": raw.decode("utf-8", "replace")}


class VllmRouterClient:
    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def list(self) -> dict[str, str]:
        urls = _http("GET", f"{self.base}/list_workers").get("urls") or []
        return {u.rstrip("/"): u for u in urls}

    def add(self, url: str) -> None:
        _http("POST", f"{self.base}/add_worker?url={urllib.parse.quote(url, safe='')}")

    def remove(self, url: str, handle: str) -> None:
        _http("POST", f"{self.base}/remove_worker?url={urllib.parse.quote(handle, safe='')}")


class SglangRouterClient:
    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def list(self) -> dict[str, str]:
        workers = _http("GET", f"{self.base}/workers").get("workers") or []
        return {w["url"].rstrip("/"): w["id"] for w in workers if "url" in w and "id" in w}

    def add(self, url: str) -> None:
        _http("POST", f"{self.base}/workers", {"url": url})

    def remove(self, url: str, handle: str) -> None:
        _http("DELETE", f"{self.base}/workers/{urllib.parse.quote(handle, safe='')}")


def client_for(kind: str, base: str):
    if kind == "vllm-router":
        return VllmRouterClient(base)
    if kind == "sglang-router":
        return SglangRouterClient(base)
    raise ValueError(f"unknown router kind {kind!r}; use one of {KINDS}")


def sync_once(client, raw_table: dict, model: str | None = None) -> dict[str, list[str]]:
    desired = desired_urls(raw_table, model)
    current = client.list()
    to_add, to_remove = plan_sync(desired, set(current))
    for url in to_add:
        client.add(url)
        log.info("added %s", url)
    for url in to_remove:
        client.remove(url, current[url])
        log.info("removed %s", url)
    return {"added": to_add, "removed": to_remove}


def pull_table(control_plane: str, cluster: str, gateway_name: str, secret: str) -> dict:
    url = f"{control_plane.rstrip('/')}/routing/v1/clusters/{cluster}/table"
    path = urllib.parse.urlsplit(url).path
    headers = {signing.GATEWAY_HEADER: gateway_name,
               **signing.signed_headers(secret, "GET", path, b"", now=time.time())}
    req = urllib.request.Request(url, headers=headers)  # noqa: S310
    with urllib.request.urlopen(req, timeout=10) as response:  # noqa: S310
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="router_sync", description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--router", required=True, help="the router's base URL")
    p.add_argument("--table", help="routing table JSON file")
    p.add_argument("--control-plane")
    p.add_argument("--cluster")
    p.add_argument("--gateway-name")
    p.add_argument("--model", help="only this model's workers (default: all)")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--once", action="store_true")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    if not args.table and not (args.control_plane and args.cluster and args.gateway_name):
        p.error("give --table, or --control-plane with --cluster and --gateway-name")
    secret = os.environ.get("PDPLANE_GATEWAY_SECRET", "")
    client = client_for(args.kind, args.router)
    while True:
        try:
            if args.table:
                with open(args.table) as fh:
                    raw = json.load(fh)
            else:
                raw = pull_table(args.control_plane, args.cluster, args.gateway_name, secret)
            result = sync_once(client, raw, args.model)
            if result["added"] or result["removed"]:
                log.info("synced: %s", result)
        except (OSError, ValueError, TableError, urllib.error.URLError) as exc:
            log.warning("sync failed: %s", exc)
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
