"""The simulated node's telemetry endpoint (``GET /sim/v1/node``, docs/sim.md).

Read once per report and shared by the GPU and link collectors, which then behave as if
the numbers came from NVML and sysfs.
"""

from __future__ import annotations

import json
import time
import urllib.request


class SimNodeSource:
    def __init__(self, base_url: str, timeout_s: float = 2.0):
        # Accept the node's base URL or the full telemetry URL the launcher prints.
        base = base_url.rstrip("/")
        self.base_url = base.removesuffix("/sim/v1/node")
        self.timeout_s = timeout_s
        self._cached: dict | None = None
        self._cached_at = 0.0

    def fetch(self, max_age_s: float = 0.2) -> dict:
        """The node document; cached for ``max_age_s`` so collectors share one request."""
        now = time.monotonic()
        if self._cached is None or now - self._cached_at > max_age_s:
            url = f"{self.base_url}/sim/v1/node"
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310
                self._cached = json.loads(resp.read())
            self._cached_at = now
        return self._cached
