"""Signing (checked against the standardwebhooks library), payloads, the webhook retry
schedule (parse_retry_after: tests/unit/test_outbox_backoff.py), SSRF guard."""

import json
import random
import time

import pytest
from standardwebhooks.webhooks import Webhook

from controlplane.alerts import payloads, signing, ssrf
from controlplane.alerts.conf import DEFAULT_RETRY_SCHEDULE_S
from controlplane.alerts.delivery import JITTER
from controlplane.alerts.lifecycle import AlertState, Notification
from controlplane.outbox.backoff import Backoff


def test_signature_verifies_with_standardwebhooks_library():
    secret = signing.generate_secret()
    assert secret.startswith("whsec_")
    body = b'{"hello":"world"}'
    ts = int(time.time())
    headers = signing.headers([secret], "msg_1", ts, body)
    assert Webhook(secret).verify(body, headers) == {"hello": "world"}
    signing.verify(secret, headers, body, now=ts)


def test_rotation_signs_with_both_secrets():
    old, new = signing.generate_secret(), signing.generate_secret()
    body, ts = b"{}", int(time.time())
    headers = signing.headers([new, old], "msg_2", ts, body)
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (old, new):
        Webhook(secret).verify(body, headers)


def test_tampering_and_stale_timestamps_fail():
    secret = signing.generate_secret()
    ts = int(time.time())
    headers = signing.headers([secret], "msg_3", ts, b'{"a":1}')
    with pytest.raises(Exception):  # noqa: B017 - the library raises several types
        Webhook(secret).verify(b'{"a":2}', headers)
    with pytest.raises(signing.SignatureError):
        signing.verify(secret, headers, b'{"a":1}', now=ts + 301)
    with pytest.raises(signing.SignatureError):
        signing.verify(signing.generate_secret(), headers, b'{"a":1}', now=ts)


def _notification():
    alerts = [
        AlertState(
            "f1",
            {"alertname": "NodeOffline", "severity": "critical", "cluster": "c", "node": "a"},
            {"summary": "a down"},
            "firing",
            0,
            starts_at=100,
        ),
        AlertState(
            "f2",
            {"alertname": "NodeOffline", "severity": "critical", "cluster": "c", "node": "b"},
            {"summary": "b down"},
            "resolved",
            0,
            starts_at=100,
            ends_at=200,
        ),
    ]
    return Notification(
        '{}:{alertname="NodeOffline", cluster="c"}',
        {"alertname": "NodeOffline", "cluster": "c"},
        "firing",
        alerts,
        "first",
    )


def test_alertmanager_v4_body():
    body = payloads.alertmanager_v4(_notification(), receiver="r", external_url="https://pd")
    assert body["version"] == "4" and body["status"] == "firing"
    assert body["commonLabels"] == {
        "alertname": "NodeOffline",
        "severity": "critical",
        "cluster": "c",
    }
    assert body["commonAnnotations"] == {}
    a, b = body["alerts"]
    assert a["endsAt"] == "0001-01-01T00:00:00Z" and b["endsAt"] == "1970-01-01T00:03:20Z"
    assert a["startsAt"] == "1970-01-01T00:01:40Z"
    assert a["generatorURL"] == "https://pd/alerts/?fingerprint=f1"
    truncated = payloads.alertmanager_v4(
        _notification(), receiver="r", external_url="", max_alerts=1
    )
    assert truncated["truncatedAlerts"] == 1 and len(truncated["alerts"]) == 1


def test_native_body_and_deterministic_encoding():
    body = payloads.native(_notification(), external_url="", sent_at=0)
    assert body["type"] == "pdplane.alerts.notification"
    assert [a["status"] for a in body["alerts"]] == ["firing", "resolved"]
    assert payloads.encode(body) == payloads.encode(json.loads(payloads.encode(body)))


def test_backoff_schedule_with_jitter_and_retry_after():
    rng = random.Random(1)
    policy = Backoff(DEFAULT_RETRY_SCHEDULE_S, JITTER)  # what webhook deliveries wait
    assert policy.delay(0, rng=rng) == 0
    d1 = policy.delay(1, rng=rng)
    assert 4 <= d1 <= 6
    delays = [policy.delay(n, rng=rng) for n in range(1, 10)]
    assert sum(delays) > 24 * 3600  # spans more than a day
    assert policy.delay(10) is None
    assert policy.delay(1, retry_after=120, rng=rng) == 120
    assert policy.delay(3, retry_after=1, rng=rng) >= 1800 * 0.8  # never sooner


def fake_dns(table):
    return lambda host, port: table[host]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.5",
        "172.16.9.9",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "fd00::5",
        "0.0.0.0",
        "100.64.0.1",
        "::ffff:127.0.0.1",
        "224.0.0.1",
    ],
)
def test_private_targets_refused(address):
    with pytest.raises(ssrf.UnsafeTarget):
        ssrf.check_url(
            "http://hook.example/x", ssrf.AllowList(), fake_dns({"hook.example": [address]})
        )


def test_any_private_answer_refuses_the_host():
    resolve = fake_dns({"mixed.example": ["93.184.216.34", "10.0.0.1"]})
    with pytest.raises(ssrf.UnsafeTarget):
        ssrf.check_url("https://mixed.example/", ssrf.AllowList(), resolve)


def test_public_target_pins_the_checked_address():
    target = ssrf.check_url(
        "https://hook.example:8443/p?q=1",
        ssrf.AllowList(),
        fake_dns({"hook.example": ["93.184.216.34"]}),
    )
    assert (target.address, target.port, target.path, target.host) == (
        "93.184.216.34",
        8443,
        "/p?q=1",
        "hook.example",
    )


def test_allow_list_by_cidr_and_host():
    allow = ssrf.parse_allow_list(["127.0.0.0/8", "receiver.internal"])
    resolve = fake_dns(
        {
            "127.0.0.1": ["127.0.0.1"],
            "receiver.internal": ["10.9.9.9"],
            "other.internal": ["10.9.9.9"],
        }
    )
    assert ssrf.check_url("http://127.0.0.1:9000/", allow, resolve).address == "127.0.0.1"
    assert ssrf.check_url("http://receiver.internal/", allow, resolve).address == "10.9.9.9"
    with pytest.raises(ssrf.UnsafeTarget):
        ssrf.check_url("http://other.internal/", allow, resolve)


@pytest.mark.parametrize(
    "url", ["ftp://x.example/", "http:///nohost", "http://user:pw@x.example/", "http://x:99999/"]
)
def test_malformed_urls_refused(url):
    with pytest.raises(ssrf.UnsafeTarget):
        ssrf.check_url(url, ssrf.AllowList(), fake_dns({"x.example": ["93.184.216.34"]}))


def test_allow_list_rejects_junk():
    with pytest.raises(ValueError):
        ssrf.parse_allow_list(["http://x/"])


def test_static_check_needs_no_dns():
    ssrf.check_url_static("https://hooks.example.com/x", ssrf.AllowList())  # not resolved
    for url in ("http://127.0.0.1/", "http://localhost:8080/", "http://[::1]/", "http://10.1.1.1/"):
        with pytest.raises(ssrf.UnsafeTarget):
            ssrf.check_url_static(url, ssrf.AllowList())
    ssrf.check_url_static("http://127.0.0.1/", ssrf.parse_allow_list(["127.0.0.1"]))
