"""Login/logout, the token page, the admin site and dashboard pages per role."""

import pytest
from django.core.management import call_command
from django.test import Client

from controlplane.accounts.models import APIToken
from controlplane.accounts.roles import ROLES, role_of
from tests.integration.api_support import build_fleet, make_user

pytestmark = pytest.mark.django_db

FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _client(role):
    client = Client()
    if role is not None:
        client.force_login(make_user(role))
    return client


def test_login_and_logout(settings):
    settings.PASSWORD_HASHERS = FAST_HASHER
    user = make_user("viewer", "vera")
    user.set_password("pw-12345678")
    user.save()
    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b"Log in" in page.content
    bad = client.post("/accounts/login/", {"username": "vera", "password": "wrong"})
    assert bad.status_code == 200 and not bad.wsgi_request.user.is_authenticated
    ok = client.post("/accounts/login/", {"username": "vera", "password": "pw-12345678"})
    assert ok.status_code == 302
    # GET only asks; POST logs out
    assert client.get("/accounts/logout/").status_code == 200
    assert client.get("/accounts/tokens/").status_code == 200
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/accounts/tokens/").status_code == 302


def test_token_page_shows_the_token_once_and_revokes():
    client = _client("operator")
    created = client.post("/accounts/tokens/", {"scope": "write", "description": "ci"})
    assert created.status_code == 200
    token = APIToken.objects.get(scope="write")
    raw = created.context["new_token"]
    assert raw.startswith(f"pdp_{token.prefix}_")
    assert raw.encode() in created.content
    assert raw.encode() not in client.get("/accounts/tokens/").content
    # An admin-scope token is allowed too: it is clipped to the operator role.
    client.post("/accounts/tokens/", {"scope": "admin"})
    assert APIToken.objects.count() == 2
    client.post(f"/accounts/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked


# (path, method, minimum role) for pages behind login
UI_PAGES = [
    ("/accounts/tokens/", "get", "viewer"),
    ("/admin/topology/node/", "get", "viewer"),
    ("/admin/audit/changerecord/", "get", "viewer"),
    ("/admin/topology/node/add/", "get", "admin"),
    ("/admin/accounts/apitoken/", "get", "viewer"),
]
RANK = {None: 0, "viewer": 1, "operator": 2, "admin": 3}


@pytest.mark.parametrize("role", [None, *ROLES])
def test_ui_permission_matrix(role):
    client = Client()
    if role is not None:
        client.force_login(make_user(role))
    for path, method, minimum in UI_PAGES:
        response = getattr(client, method)(path)
        if role is None:
            assert response.status_code == 302 and "login" in response["Location"], path
        elif RANK[role] >= RANK[minimum]:
            assert response.status_code == 200, (role, path, response.status_code)
        else:
            assert response.status_code == 403, (role, path, response.status_code)


@pytest.mark.parametrize(("role", "allowed"), [("viewer", False), ("operator", True),
                                               ("admin", True)])
def test_ui_worker_action_by_role(role, allowed):
    fleet = build_fleet()
    worker = fleet["worker"]
    client = _client(role)
    response = client.post(f"/nodes/{worker.node_id}/workers/{worker.pk}/drain")
    assert (response.status_code != 403) is allowed


def test_dashboard_requires_login():
    response = Client().get("/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_create_demo_users(settings):
    settings.PASSWORD_HASHERS = FAST_HASHER
    call_command("create_demo_users", "--password", "demo-pass-1")
    from django.contrib.auth import get_user_model

    users = {u.username: u for u in get_user_model().objects.filter(username__in=ROLES)}
    assert {name: role_of(user) for name, user in users.items()} == {r: r for r in ROLES}
    assert Client().login(username="operator", password="demo-pass-1")


def test_admin_creates_a_token_and_sees_it_once():
    admin = make_user("admin", "root")
    client = Client()
    client.force_login(admin)
    response = client.post("/admin/accounts/apitoken/add/", {
        "user": admin.pk, "description": "from admin", "scope": "read", "expires_0": "",
        "expires_1": "",
    }, follow=True)
    assert response.status_code == 200
    token = APIToken.objects.get(description="from admin")
    shown = [str(m) for m in response.context["messages"]]
    assert any(f"pdp_{token.prefix}_" in m for m in shown), shown
    assert len(token.token_hash) == 64
