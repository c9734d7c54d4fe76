#!/usr/bin/env python3
"""Container health check: GET a URL, healthy on HTTP 200 within the timeout.

Used by the image's HEALTHCHECK (``/healthz`` of the web process) and by compose for the
gateway (``/health``). The request carries a Host header Django accepts — the first
``ALLOWED_HOSTS`` entry — so a deployment that allows only its public name still passes.
"""

import os
import sys
import urllib.error
import urllib.request


def host_header() -> str | None:
    for item in os.environ.get("ALLOWED_HOSTS", "").split(","):
        item = item.strip().lstrip(".")
        if item and item != "*":
            return item
    return None


def main(argv: list[str]) -> int:
    url = argv[1] if len(argv) > 1 else "http://127.0.0.1:8000/healthz"
    request = urllib.request.Request(url)  # noqa: S310 - a fixed http URL on loopback
    host = host_header()
    if host and "/healthz" in url:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=4) as response:  # noqa: S310
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
