"""API token format, hashing, expiry, revocation and the authentication header forms."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts.access import can, restrict, set_role
from controlplane.accounts.models import APIToken, hash_token
from controlplane.accounts.roles import role_of
from controlplane.topology.models import Cluster
from tests.integration.api_support import make_user

pytestmark = pytest.mark.django_db


def _get(raw, keyword="Bearer"):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {raw}")
    return client.get("/api/v1/clusters/")


def test_token_is_stored_hashed_and_found_by_prefix():
    token, raw = APIToken.issue(make_user("viewer"), scope="read")
    assert raw.startswith(f"pdp_{token.prefix}_") and len(raw) > 40
    assert token.token_hash == hash_token(raw) and raw not in token.token_hash
    assert _get(raw).status_code == 200
    assert _get(raw, "Token").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


@pytest.mark.parametrize("mangle", [
    lambda raw: raw[:-1] + ("A" if raw[-1] != "A" else "B"),   # wrong secret
    lambda raw: "pdp_00000000_" + raw[13:],                      # unknown prefix
    lambda raw: raw.replace("pdp_", "xyz_"),                     # not ours
    lambda raw: "pdp_",                                          # truncated
])
def test_wrong_tokens_are_401(mangle):
    _, raw = APIToken.issue(make_user("viewer"))
    response = _get(mangle(raw))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_expired_and_revoked_tokens_are_refused():
    user = make_user("admin")
    _, raw_expired = APIToken.issue(user, expires=timezone.now() - timedelta(seconds=1))
    revoked, raw_revoked = APIToken.issue(user)
    revoked.revoked = True
    revoked.save()
    assert _get(raw_expired).status_code == 401
    assert _get(raw_revoked).status_code == 401


def test_inactive_user_token_is_refused():
    user = make_user("admin")
    _, raw = APIToken.issue(user)
    user.is_active = False
    user.save()
    assert _get(raw).status_code == 401


def test_token_api_refuses_past_expiry():
    client = APIClient()
    client.force_login(make_user("admin"))
    past = (timezone.now() - timedelta(days=1)).isoformat()
    response = client.post("/api/v1/tokens/", {"scope": "read", "expires": past}, format="json")
    assert response.status_code == 400 and "expires" in response.json()["error"]["fields"]


def test_malformed_header_is_401():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer a b")
    assert client.get("/api/v1/clusters/").status_code == 401


def test_token_delete_revokes_only_own():
    alice = make_user("viewer", "alice")
    bob_token, _ = APIToken.issue(make_user("viewer", "bob"))
    _, raw = APIToken.issue(alice)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.delete(f"/api/v1/tokens/{bob_token.pk}/").status_code == 404
    listed = client.get("/api/v1/tokens/").json()
    assert listed["count"] == 1 and "token" not in listed["results"][0]


def test_roles_and_restrict():
    Cluster.objects.create(name="c1")
    viewer, superuser = make_user("viewer"), make_user(None, "root")
    superuser.is_superuser = True
    superuser.save()
    assert role_of(viewer) == "viewer" and role_of(superuser) == "admin"
    assert can(viewer, "read") and not can(viewer, "action") and not can(viewer, "write")
    assert restrict(Cluster.objects.all(), viewer, "read").count() == 1
    assert restrict(Cluster.objects.all(), viewer, "write").count() == 0
    set_role(viewer, "operator")
    assert role_of(viewer) == "operator" and can(viewer, "action")
    with pytest.raises(ValueError):
        can(viewer, "fly")
    _, raw = APIToken.issue(superuser, scope="read")
    token = APIToken.objects.get(prefix=raw[4:12])
    assert can(superuser, "read", token) and not can(superuser, "write", token)
