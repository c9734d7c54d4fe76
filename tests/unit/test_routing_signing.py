"""HMAC signing shared by pushes (control plane → gateway) and pulls (gateway → control plane)."""

import pytest

from controlplane.routing import signing as cp_signing
from gateway import signing

NOW = 1_800_000_000


def headers(secret="s1",  # noqa: S107
             method="PUT", path="/admin/routing-table", body=b"{}", now=NOW):
    return signing.signed_headers(secret, method, path, body, now=now)


def check(h, secrets="s1", method="PUT", path="/admin/routing-table", body=b"{}", now=NOW):
    signing.verify(secrets, h.get(signing.TIMESTAMP_HEADER), h.get(signing.SIGNATURE_HEADER),
                   method, path, body, now=now)


def test_round_trip():
    check(headers())
    assert cp_signing.sign is signing.sign  # one implementation for both sides


@pytest.mark.parametrize(
    "change",
    [
        {"body": b'{"x":1}'},
        {"method": "GET"},
        {"path": "/admin/other"},
        {"secrets": "other"},
    ],
)
def test_any_change_breaks_the_signature(change):
    with pytest.raises(signing.SignatureError, match="does not match"):
        check(headers(), **change)


def test_timestamp_window():
    check(headers(), now=NOW + 299)
    with pytest.raises(signing.SignatureError, match="outside"):
        check(headers(), now=NOW + 301)
    with pytest.raises(signing.SignatureError, match="outside"):
        check(headers(), now=NOW - 301)


def test_missing_or_malformed_headers():
    with pytest.raises(signing.SignatureError, match="missing"):
        check({})
    h = headers()
    with pytest.raises(signing.SignatureError, match="integer"):
        check({**h, signing.TIMESTAMP_HEADER: "soon"})
    with pytest.raises(signing.SignatureError, match="no v1"):
        check({**h, signing.SIGNATURE_HEADER: "v0=abc"})


def test_secret_rotation_accepts_either_key_and_several_signatures():
    old = headers(secret="old")
    check(old, secrets=["new", "old"])
    both = f"{headers(secret='new')[signing.SIGNATURE_HEADER]} {old[signing.SIGNATURE_HEADER]}"
    check({**old, signing.SIGNATURE_HEADER: both}, secrets=["old"])
    with pytest.raises(signing.SignatureError):
        check(old, secrets=["new", ""])


def test_empty_secret_cannot_sign():
    with pytest.raises(signing.SignatureError):
        signing.sign("", NOW, "PUT", "/", b"")
