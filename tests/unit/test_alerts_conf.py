"""Alert settings: strict parsing, fail fast on nonsense."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from controlplane.alerts.conf import DEFAULT_RETRY_SCHEDULE_S, load


def test_defaults(monkeypatch):
    for name in ("ALERTS_RETRY_SCHEDULE", "ALERTS_DELIVERY_TIMEOUT_S", "ALERTS_CLAIM_LEASE_S"):
        monkeypatch.delenv(name, raising=False)
    conf = load()
    assert conf.retry_schedule_s == DEFAULT_RETRY_SCHEDULE_S
    assert (conf.timeout_s, conf.lease_s) == (15.0, 120.0)
    assert conf.lifecycle.repeat_interval_s == 4 * 3600


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("ALERTS_RETRY_SCHEDULE", "0,1,2.5")
    monkeypatch.setenv("ALERTS_GROUP_WAIT_S", "0")
    conf = load()
    assert conf.retry_schedule_s == (0.0, 1.0, 2.5)
    assert conf.lifecycle.group_wait_s == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ALERTS_RETRY_SCHEDULE", "0,soon"),
        ("ALERTS_RETRY_SCHEDULE", "0,-5"),
        ("ALERTS_DELIVERY_TIMEOUT_S", "abc"),
        ("ALERTS_CLAIM_LEASE_S", "10"),  # not above the 15 s timeout
        ("ALERTS_KICK_SWEEPER", "maybe"),
        ("ALERTS_EXTERNAL_URL", "ftp://x"),
    ],
)
def test_bad_values_fail_fast(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match="ALERTS_"):
        load()


def test_bad_allow_list_fails_fast():
    with (
        override_settings(ALERTS_WEBHOOK_ALLOW=["http://nope/"]),
        pytest.raises(ImproperlyConfigured),
    ):
        load()
