"""How the control plane reads a gateway's answer, and how long it waits before retrying."""

import random

import pytest

from controlplane.routing.delivery import BACKOFF, _interpret

BACKOFF_CAP_S = 300


def test_backoff_doubles_with_jitter_and_is_capped():
    assert BACKOFF.max_attempts == 25
    rng = random.Random(1)
    for attempt, ceiling in [(1, 1), (2, 2), (3, 4), (6, 32), (20, BACKOFF_CAP_S)]:
        delays = [BACKOFF.delay(attempt, rng=rng) for _ in range(200)]
        assert min(delays) >= ceiling * 0.5 and max(delays) <= ceiling
        assert len({round(d, 6) for d in delays}) > 100  # jittered, not a fixed schedule


@pytest.mark.parametrize(
    ("status", "body", "outcome", "applied"),
    [
        (200, b'{"status":"ack","applied_version":7}', "ack", 7),
        (409, b'{"status":"stale","applied_version":9,"error":"old"}', "stale", 9),
        (422, b'{"status":"nack","applied_version":6,"error":"bad role"}', "nack", 6),
        (400, b"not json", "nack", None),
        (401, b'{"status":"unauthorized","error":"signature does not match"}', "unauthorized",
         None),
        (503, b"", "error", None),
        (200, b'{"applied_version": -3}', "ack", None),
    ],
)
def test_answers_are_classified(status, body, outcome, applied):
    result = _interpret(status, body)
    assert (result.outcome, result.applied_version, result.status_code) == (
        outcome, applied, status)


def test_nack_keeps_the_gateways_reason():
    assert _interpret(422, b'{"error":"models/0/mode: bad"}').error == "models/0/mode: bad"
