"""Health of prefill→decode pairs. Pure; the gateway feeds it outcomes and asks it before
pairing.

A pair fails when the prefill worker errs or times out for it, or the decode worker
refuses the transfer parameters (it could not fetch the KV from that prefill worker). Each
worker may be fine on its own — a broken link or an incompatible pair fails only together
— so health is kept per pair, like a circuit breaker:

- ``healthy`` → ``unhealthy`` after ``threshold`` failures in a row; the gateway stops
  pairing the two for ``cooldown_s`` (doubling on each relapse, up to ``max_cooldown_s``);
- after the cooldown the pair is ``probing``: one request may use it (the gateway retries
  elsewhere before the first byte if it fails, so the client does not see the probe);
  success → ``healthy``, failure → ``unhealthy`` again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class PairState:
    state: str = "healthy"  # healthy | unhealthy | probing
    failures_in_row: int = 0
    failures: int = 0
    successes: int = 0
    last_failure: str = ""
    last_failure_at: float | None = None
    retry_at: float = 0.0
    cooldown_s: float = 0.0
    probe_in_flight: bool = False
    probe_at: float = 0.0


@dataclass
class PairHealth:
    threshold: int = 1
    cooldown_s: float = 5.0
    max_cooldown_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    pairs: dict[tuple[str, str], PairState] = field(default_factory=dict)

    def allows(self, prefill: str, decode: str) -> bool:
        """May a request be sent over this pair now? (Claims the probe slot when due.)"""
        pair = self.pairs.get((prefill, decode))
        if pair is None or pair.state == "healthy":
            return True
        if pair.state == "unhealthy" and self.clock() >= pair.retry_at:
            pair.state = "probing"
            pair.probe_in_flight = False
        now = self.clock()
        # A probe whose request ended some other way (the decode worker failed, the client
        # left) never reports back: after a while, let another request probe.
        if pair.state == "probing" and (not pair.probe_in_flight
                                        or now - pair.probe_at > max(pair.cooldown_s, 10.0)):
            pair.probe_in_flight, pair.probe_at = True, now
            return True
        return False

    def failed(self, prefill: str, decode: str, why: str) -> None:
        pair = self.pairs.setdefault((prefill, decode), PairState())
        pair.failures += 1
        pair.failures_in_row += 1
        pair.last_failure, pair.last_failure_at = why, time.time()
        pair.probe_in_flight = False
        if pair.state == "probing" or pair.failures_in_row >= self.threshold:
            relapse = pair.state == "probing"
            pair.cooldown_s = (min(pair.cooldown_s * 2, self.max_cooldown_s) if relapse
                               else self.cooldown_s)
            pair.state = "unhealthy"
            pair.retry_at = self.clock() + pair.cooldown_s

    def succeeded(self, prefill: str, decode: str) -> None:
        pair = self.pairs.get((prefill, decode))
        if pair is None:
            return  # healthy pairs are not tracked until they first fail
        pair.successes += 1
        pair.failures_in_row = 0
        pair.probe_in_flight = False
        pair.state = "healthy"
        pair.cooldown_s = 0.0

    def state(self, prefill: str, decode: str) -> str:
        pair = self.pairs.get((prefill, decode))
        return pair.state if pair else "healthy"

    def forget_workers(self, keep: set[str]) -> None:
        """Drop pairs with a worker no longer in the table."""
        for key in [k for k in self.pairs if k[0] not in keep or k[1] not in keep]:
            del self.pairs[key]

    def view(self) -> list[dict]:
        return [{"prefill": p, "decode": d, "state": s.state, "failures": s.failures,
                 "successes": s.successes, "last_failure": s.last_failure,
                 "last_failure_at": s.last_failure_at, "cooldown_s": s.cooldown_s}
                for (p, d), s in sorted(self.pairs.items())]
