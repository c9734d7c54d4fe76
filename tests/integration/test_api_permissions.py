"""Permission matrix over the API: viewer / operator / admin × read / write / action, and
token scopes that narrow (never widen) the owner's role."""

import pytest

from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db

# role → (read, write, action) expected to be allowed
MATRIX = {
    "viewer": (True, False, False),
    "operator": (True, False, True),
    "admin": (True, True, True),
    None: (False, False, False),
}


def _attempt(client, fleet):
    worker = fleet["worker"]
    read = client.get("/api/v1/nodes/")
    write = client.patch(f"/api/v1/clusters/{fleet['cluster'].pk}/", {"description": "x"},
                         format="json")
    action = client.post(f"/api/v1/workers/{worker.pk}/drain/", {"reason": "t"}, format="json")
    return read.status_code, write.status_code, action.status_code


@pytest.mark.parametrize("role", list(MATRIX))
@pytest.mark.parametrize("auth", ["token", "session"])
def test_role_matrix(role, auth):
    fleet = build_fleet()
    user = make_user(role)
    if auth == "token":
        client, _ = token_client(user, scope="admin")
    else:
        from rest_framework.test import APIClient

        client = APIClient(enforce_csrf_checks=False)
        client.force_login(user)
    codes = _attempt(client, fleet)
    expected = MATRIX[role]
    for allowed, code, what in zip(expected, codes, ("read", "write", "action"), strict=True):
        if allowed:
            assert 200 <= code < 300, f"{role} {what} via {auth}: {code}"
        else:
            assert code == 403, f"{role} {what} via {auth}: {code}"


@pytest.mark.parametrize(
    ("scope", "expected"),
    [("read", (True, False, False)), ("write", (True, True, True)), ("admin", (True, True, True))],
)
def test_token_scope_narrows_admin(scope, expected):
    fleet = build_fleet()
    client, _ = token_client(make_user("admin"), scope=scope)
    codes = _attempt(client, fleet)
    assert [200 <= c < 300 for c in codes] == list(expected), codes


def test_write_token_cannot_exceed_viewer_role():
    fleet = build_fleet()
    client, _ = token_client(make_user("viewer"), scope="write")
    read, write, action = _attempt(client, fleet)
    assert (read, write, action) == (200, 403, 403)


def test_token_cannot_mint_a_wider_token():
    client, _ = token_client(make_user("admin"), scope="read")
    response = client.post("/api/v1/tokens/", {"scope": "write"}, format="json")
    assert response.status_code == 400
    assert "scope" in response.json()["error"]["fields"]
    ok = client.post("/api/v1/tokens/", {"scope": "read", "description": "ci"}, format="json")
    assert ok.status_code == 201
    assert ok.json()["token"].startswith("pdp_")


def test_anonymous_is_401_with_error_body():
    from rest_framework.test import APIClient

    response = APIClient().get("/api/v1/nodes/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")
