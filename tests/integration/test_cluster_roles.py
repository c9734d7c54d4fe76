"""Roles per cluster: a permission matrix over the API, the pages, the live websocket, the
Prometheus SD list and /metrics (PostgreSQL + Redis channel layer).

Two fleets, "a" and "b". A viewer of a sees nothing of b — not by id, list, filter, live
fan-out or SD; an operator of a acts on a but not on b; fleet-wide roles still see and do
everything; tokens narrow their owner, never widen.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts import access
from controlplane.accounts.access import set_role
from controlplane.accounts.models import APIToken, ClusterMembership
from controlplane.alerts.models import Alert
from controlplane.audit.models import ChangeRecord
from controlplane.planner.models import Plan
from controlplane.routing.models import RoutingTableVersion
from tests.integration.api_support import build_fleet, make_user, token_client
from tests.integration.live_support import WAIT_S, beyond_status, next_update

pytestmark = pytest.mark.django_db


def _extras(fleet: dict) -> dict:
    cluster = fleet["cluster"]
    fleet["table"] = RoutingTableVersion.objects.create(
        cluster=cluster, version=1, body={"cluster": cluster.name, "version": 1},
        content_sha="0" * 64, cause="test")
    fleet["plan"] = Plan.objects.create(cluster=cluster, served_model=fleet["model"],
                                        current_layout="1P:1D", target_layout="2P:1D")
    fleet["alert"] = Alert.objects.create(
        fingerprint=f"fp-{cluster.name}", rule="node_stale", severity="warning",
        status="firing", is_open=True, labels={"cluster": cluster.name},
        group_key=f"g-{cluster.name}", active_since=timezone.now(),
        last_evaluated_at=timezone.now())
    return fleet


@pytest.fixture
def fleets():
    return {name: _extras(build_fleet(name)) for name in ("a", "b")}


def member(username: str, **roles: str):
    """A user with no fleet-wide role and ``roles`` on clusters (by name)."""
    from controlplane.topology.models import Cluster

    user = make_user(None, username)
    for cluster_name, role in roles.items():
        access.set_cluster_role(Cluster.objects.get(name=cluster_name), role, user=user)
    return user


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def detail_urls(fleet: dict) -> list[str]:
    return [
        f"/api/v1/clusters/{fleet['cluster'].pk}/",
        f"/api/v1/clusters/{fleet['cluster'].pk}/live/",
        f"/api/v1/fabrics/{fleet['fabric'].pk}/",
        f"/api/v1/nodes/{fleet['nodes'][0].pk}/",
        f"/api/v1/nodes/{fleet['nodes'][0].pk}/live/",
        f"/api/v1/gpus/{fleet['gpus'][0].pk}/",
        f"/api/v1/nics/{fleet['nodes'][0].nics.first().pk}/",
        f"/api/v1/served-models/{fleet['model'].pk}/",
        f"/api/v1/served-models/{fleet['model'].pk}/effective-policy/",
        f"/api/v1/workers/{fleet['worker'].pk}/",
        f"/api/v1/gateways/{fleet['gateway'].pk}/",
        f"/api/v1/policies/{fleet['policy'].pk}/",
        f"/api/v1/routing-tables/{fleet['table'].pk}/",
        f"/api/v1/routing-tables/{fleet['table'].pk}/diff/",
        f"/api/v1/routing-tables/current/?cluster_id={fleet['cluster'].pk}",
        f"/api/v1/plans/{fleet['plan'].pk}/",
        f"/api/v1/alerts/{fleet['alert'].pk}/",
    ]


LISTS = ["clusters", "fabrics", "nodes", "gpus", "nics", "served-models", "workers",
         "gateways", "policies", "routing-tables", "plans", "alerts"]


# --- API: reads --------------------------------------------------------------------------
@pytest.mark.parametrize("auth", ["session", "token"])
def test_viewer_of_a_sees_nothing_of_b_by_id_list_or_filter(fleets, auth):
    viewer = member("viewer-a", a="viewer")
    client = session(viewer) if auth == "session" else token_client(viewer, "read")[0]
    for url in detail_urls(fleets["a"]):
        assert client.get(url).status_code in (200, 503), url  # 503: live state, no Redis key
    for url in detail_urls(fleets["b"]):
        response = client.get(url)
        assert response.status_code == 404, (url, response.status_code)
    for resource in LISTS:
        body = client.get(f"/api/v1/{resource}/").json()
        text = repr(body["results"])
        assert body["count"] >= 1, resource
        assert "'b'" not in text and "b-n" not in text and "fp-b" not in text, resource
    # Filtering for b's objects, by id or by name, finds nothing.
    b = fleets["b"]
    assert client.get(f"/api/v1/nodes/?cluster_id={b['cluster'].pk}").json()["count"] == 0
    assert client.get("/api/v1/nodes/?hostname=b-n0").json()["count"] == 0
    assert client.get("/api/v1/nodes/?cluster=b").json()["count"] == 0
    assert client.get(f"/api/v1/workers/?cluster_id={b['cluster'].pk}").json()["count"] == 0
    assert client.get("/api/v1/alerts/?fingerprint=fp-b").json()["count"] == 0
    # Fleet-wide objects (webhook endpoints, silences) are not a cluster viewer's.
    assert client.get("/api/v1/webhook-endpoints/").json()["count"] == 0


def test_audit_log_is_scoped_to_visible_objects(fleets):
    viewer = member("viewer-a", a="viewer")
    a_nodes = {str(n.pk) for n in fleets["a"]["nodes"]}
    b_nodes = {str(n.pk) for n in fleets["b"]["nodes"]}
    assert ChangeRecord.objects.filter(object_type="topology.node",
                                       object_id__in=b_nodes).exists()
    records = session(viewer).get("/api/v1/audit/?limit=500").json()["results"]
    seen = {(r["object_type"], r["object_id"]) for r in records}
    assert {("topology.node", i) for i in a_nodes} <= seen
    assert not {("topology.node", i) for i in b_nodes} & seen
    a_record = ChangeRecord.objects.filter(object_type="topology.node",
                                           object_id__in=a_nodes).first()
    b_record = ChangeRecord.objects.filter(object_type="topology.node",
                                           object_id__in=b_nodes).first()
    assert session(viewer).get(f"/api/v1/audit/{a_record.pk}/").status_code == 200
    assert session(viewer).get(f"/api/v1/audit/{b_record.pk}/").status_code == 404


# --- API: actions and writes ----------------------------------------------------------------
def _drain(client, fleet):
    return client.post(f"/api/v1/workers/{fleet['worker'].pk}/drain/", {"reason": "t"},
                       format="json").status_code


def test_operator_of_a_acts_on_a_not_on_b(fleets):
    client = session(member("op-a", a="operator"))
    assert _drain(client, fleets["a"]) == 200
    assert _drain(client, fleets["b"]) == 404  # b does not exist for them
    a, b = fleets["a"], fleets["b"]
    assert client.post(f"/api/v1/plans/{a['plan'].pk}/reject/", {}, format="json"
                       ).status_code == 200
    assert client.post(f"/api/v1/plans/{b['plan'].pk}/reject/", {}, format="json"
                       ).status_code == 404
    assert client.post(f"/api/v1/alerts/{b['alert'].pk}/acknowledge/").status_code == 404
    # Operators do not write inventory, on their own cluster either.
    assert client.patch(f"/api/v1/clusters/{a['cluster'].pk}/", {"description": "x"},
                        format="json").status_code == 403
    # Planning run on b: the cluster is "does not exist" (400), not forbidden.
    response = client.post("/api/v1/plans/run/", {"cluster": b["cluster"].pk}, format="json")
    assert response.status_code == 400 and "cluster" in response.json()["error"]["fields"]


def test_viewer_of_b_operator_of_a_is_403_on_b(fleets):
    client = session(member("mixed", a="operator", b="viewer"))
    assert _drain(client, fleets["a"]) == 200
    assert _drain(client, fleets["b"]) == 403
    response = client.post("/api/v1/plans/run/", {"cluster": fleets["b"]["cluster"].pk},
                           format="json")
    assert response.status_code == 403


def test_admin_of_a_writes_a_only(fleets):
    client = session(member("admin-a", a="admin"))
    a, b = fleets["a"], fleets["b"]
    assert client.patch(f"/api/v1/clusters/{a['cluster'].pk}/", {"description": "x"},
                        format="json").status_code == 200
    created = client.post("/api/v1/nodes/", {"cluster": a["cluster"].pk, "hostname": "a-new"},
                          format="json")
    assert created.status_code == 201, created.json()
    elsewhere = client.post("/api/v1/nodes/", {"cluster": b["cluster"].pk, "hostname": "b-new"},
                            format="json")
    assert elsewhere.status_code == 400 and "cluster" in elsewhere.json()["error"]["fields"]
    # Moving an a-object into b: b does not exist for them either.
    moved = client.patch(f"/api/v1/nodes/{created.json()['id']}/",
                         {"cluster": b["cluster"].pk}, format="json")
    assert moved.status_code == 400
    # Fleet-wide things need a fleet-wide role.
    assert client.post("/api/v1/clusters/", {"name": "c"}, format="json").status_code == 403
    assert client.post("/api/v1/webhook-endpoints/", {"name": "w", "url": "https://e.com/h"},
                       format="json").status_code == 403
    assert client.delete(f"/api/v1/nodes/{b['nodes'][0].pk}/").status_code == 404


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_fleet_wide_roles_still_cover_every_cluster(fleets, role):
    client = session(make_user(role, f"fleet-{role}"))
    for fleet in fleets.values():
        for url in detail_urls(fleet):
            assert client.get(url).status_code in (200, 503), url
    assert client.get("/api/v1/nodes/").json()["count"] == 4
    expected = 403 if role == "viewer" else 200
    assert _drain(client, fleets["b"]) == expected


def test_fleet_viewer_with_operator_on_a(fleets):
    user = make_user("viewer", "fleet-viewer-op-a")
    access.set_cluster_role(fleets["a"]["cluster"], "operator", user=user)
    client = session(user)
    assert _drain(client, fleets["a"]) == 200
    assert _drain(client, fleets["b"]) == 403
    assert access.role_on(user, fleets["a"]["cluster"]) == "operator"
    assert access.role_on(user, fleets["b"]["cluster"]) == "viewer"


# --- Tokens ------------------------------------------------------------------------------
def test_token_memberships_narrow_the_owner(fleets):
    admin = make_user("admin", "fleet-admin")
    client, raw = token_client(admin, "admin")
    token = APIToken.objects.get(prefix=raw[4:12])
    access.set_cluster_role(fleets["a"]["cluster"], "viewer", token=token)
    assert client.get(f"/api/v1/nodes/{fleets['a']['nodes'][0].pk}/").status_code == 200
    assert client.get(f"/api/v1/nodes/{fleets['b']['nodes'][0].pk}/").status_code == 404
    assert _drain(client, fleets["a"]) == 403  # viewer on a, whatever the owner is
    assert client.get("/api/v1/nodes/").json()["count"] == 2


def test_token_never_widens_its_owner(fleets):
    viewer = member("viewer-a", a="viewer")
    client, raw = token_client(viewer, "admin")
    token = APIToken.objects.get(prefix=raw[4:12])
    access.set_cluster_role(fleets["b"]["cluster"], "admin", token=token)  # owner has none
    # The token reaches no cluster at all: like a user without a role, refused outright.
    assert client.get(f"/api/v1/nodes/{fleets['b']['nodes'][0].pk}/").status_code == 403
    assert client.get("/api/v1/nodes/").status_code == 403
    access.set_cluster_role(fleets["a"]["cluster"], "admin", token=token)
    assert client.get(f"/api/v1/nodes/{fleets['b']['nodes'][0].pk}/").status_code == 404
    assert client.get("/api/v1/nodes/").json()["count"] == 2
    assert _drain(client, fleets["a"]) == 403  # admin on the token, viewer for the owner


def test_cluster_viewer_may_hold_tokens(fleets):
    client = session(member("viewer-a", a="viewer"))
    assert client.post("/api/v1/tokens/", {"scope": "read"}, format="json").status_code == 201
    # A write scope is clipped to the owner's roles (read on a), as for fleet-wide roles.
    raw = client.post("/api/v1/tokens/", {"scope": "write"}, format="json").json()["token"]
    clipped = APIClient()
    clipped.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert clipped.get("/api/v1/nodes/").json()["count"] == 2
    assert _drain(clipped, fleets["a"]) == 403


def test_whatif_needs_a_role_somewhere():
    body = {"gpu": "H200 SXM", "nodes": 2, "gpus_per_node": 8}
    from controlplane.topology.models import Cluster

    cluster = Cluster.objects.create(name="w")
    nobody = make_user(None, "nobody")
    assert session(nobody).post("/api/v1/what-if/", body, format="json").status_code == 403
    viewer = make_user(None, "viewer-w")
    access.set_cluster_role(cluster, "viewer", user=viewer)
    assert session(viewer).post("/api/v1/what-if/", body, format="json").status_code == 200


# --- Membership management -------------------------------------------------------------------
def test_memberships_api(fleets):
    a, b = fleets["a"]["cluster"], fleets["b"]["cluster"]
    admin_a = session(member("admin-a", a="admin"))
    newcomer = make_user(None, "newcomer")
    made = admin_a.post("/api/v1/cluster-memberships/",
                        {"cluster": a.pk, "user": "newcomer", "role": "operator"}, format="json")
    assert made.status_code == 201, made.json()
    assert ChangeRecord.objects.filter(object_type="accounts.clustermembership",
                                       object_id=str(made.json()["id"])).exists()
    assert access.role_on(get_user_model().objects.get(pk=newcomer.pk), a) == "operator"
    refused = admin_a.post("/api/v1/cluster-memberships/",
                           {"cluster": b.pk, "user": "newcomer", "role": "viewer"},
                           format="json")
    assert refused.status_code == 400  # b does not exist for an admin of a
    duplicate = admin_a.post("/api/v1/cluster-memberships/",
                             {"cluster": a.pk, "user": "newcomer", "role": "viewer"},
                             format="json")
    assert duplicate.status_code == 400
    both = admin_a.post("/api/v1/cluster-memberships/", {"cluster": a.pk, "role": "viewer"},
                        format="json")
    assert both.status_code == 400
    # Someone else's token cannot be narrowed by a cluster admin.
    _, raw = token_client(newcomer, "read")
    other_token = APIToken.objects.get(prefix=raw[4:12])
    sneaky = admin_a.post("/api/v1/cluster-memberships/",
                          {"cluster": a.pk, "token": other_token.pk, "role": "viewer"},
                          format="json")
    assert sneaky.status_code == 400
    # ...but its owner, a mere viewer or operator of a, may confine it to a.
    own = session(get_user_model().objects.get(pk=newcomer.pk)).post(
        "/api/v1/cluster-memberships/",
        {"cluster": a.pk, "token": other_token.pk, "role": "viewer"}, format="json")
    assert own.status_code == 201, own.json()
    confined = APIClient()
    confined.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert confined.get("/api/v1/nodes/").json()["count"] == 2
    # Viewers and operators of a read the memberships of a but cannot grant.
    op_a = session(get_user_model().objects.get(pk=newcomer.pk))
    listed = op_a.get("/api/v1/cluster-memberships/").json()
    assert {m["cluster"]["id"] for m in listed["results"]} == {a.pk}
    assert op_a.post("/api/v1/cluster-memberships/",
                     {"cluster": a.pk, "user": "admin-a", "role": "viewer"},
                     format="json").status_code == 403
    # Removing the membership removes the access.
    membership = ClusterMembership.objects.get(user=newcomer, cluster=a)
    assert admin_a.delete(f"/api/v1/cluster-memberships/{membership.pk}/").status_code == 204
    assert session(get_user_model().objects.get(pk=newcomer.pk)).get(
        "/api/v1/nodes/").status_code == 403


# --- Pages ---------------------------------------------------------------------------------
def test_pages_show_only_visible_clusters(client, fleets):
    client.force_login(member("viewer-a", a="viewer"))
    a, b = fleets["a"], fleets["b"]
    for url in ("/", "/live/poll", "/models/", "/plans/", "/tables/", "/policies/",
                "/changelog/"):
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert "b-n0" not in html and "b-n1" not in html, url
        assert f"/nodes/{b['nodes'][0].pk}/" not in html, url
    assert "a-n0" in client.get("/").content.decode()
    assert client.get(f"/nodes/{a['nodes'][0].pk}/").status_code == 200
    assert client.get(f"/nodes/{b['nodes'][0].pk}/").status_code == 404
    assert client.get("/policies/b/edit").status_code in (403, 404)
    # The staff-only routing views (the member is staff) and the what-if JSON view.
    assert client.get("/routing/v1/clusters/a/gateways").status_code == 200
    assert client.get("/routing/v1/clusters/b/gateways").status_code == 404
    assert client.get("/routing/v1/clusters/b/diff").status_code == 404
    assert client.get("/planner/whatif", {"gpu": "H200 SXM"}).status_code == 200


def test_page_actions_follow_the_cluster_role(client, fleets):
    client.force_login(member("mixed", a="operator", b="viewer"))
    a, b = fleets["a"], fleets["b"]
    url = "/nodes/{}/workers/{}/drain"
    assert client.post(url.format(a["nodes"][0].pk, a["worker"].pk)).status_code == 302
    assert client.post(url.format(b["nodes"][0].pk, b["worker"].pk)).status_code == 403
    assert client.post(f"/plans/{b['plan'].pk}/reject").status_code == 403
    assert client.get("/policies/b/edit").status_code == 403
    assert client.get("/policies/a/edit").status_code == 200
    client.force_login(member("op-a", a="operator"))
    assert client.post(url.format(b["nodes"][0].pk, b["worker"].pk)).status_code == 404
    assert client.post(f"/plans/{b['plan'].pk}/reject").status_code == 404


# --- Live websocket -------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_live_fan_out_of_b_never_reaches_a_viewer():
    from controlplane.dashboard.consumers import LiveTopologyConsumer, cluster_group

    def setup():
        fleets = {name: build_fleet(name) for name in ("a", "b")}
        return (member("viewer-a", a="viewer"), fleets["a"]["cluster"].pk,
                fleets["b"]["cluster"].pk, fleets["a"]["nodes"][0].pk,
                fleets["b"]["nodes"][0].pk)

    user, a_id, b_id, a_node, b_node = await sync_to_async(setup)()
    layer = get_channel_layer()
    for query in ("", "cluster=b", f"node={b_node}"):
        ws = WebsocketCommunicator(LiveTopologyConsumer.as_asgi(), f"/ws/live/?{query}")
        ws.scope["user"] = user
        connected, _ = await ws.connect(timeout=WAIT_S)
        assert connected
        try:
            snapshot = await ws.receive_from(timeout=WAIT_S)
            assert f'id="node-{b_node}"' not in snapshot, query
            if query == "":
                assert f'id="node-{a_node}"' in snapshot
            await layer.group_send(cluster_group(b_id),
                                   {"type": "telemetry.changed", "node_ids": [b_node]})
            # Even a hint naming b's node on a's group renders nothing of b.
            await layer.group_send(cluster_group(a_id),
                                   {"type": "telemetry.changed", "node_ids": [b_node]})
            assert await beyond_status(ws, 1.5) == [], query
            if query == "":
                await layer.group_send(cluster_group(a_id),
                                       {"type": "telemetry.changed", "node_ids": [a_node]})
                update = await next_update(ws)
                assert f'id="node-{a_node}"' in update and f"node-{b_node}" not in update
        finally:
            await ws.disconnect()
    await asyncio.sleep(0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_live_page_regions_show_only_visible_clusters():
    """The other live pages (plans, alerts, one node) over the same websocket."""
    from controlplane.dashboard.consumers import PAGES, LiveTopologyConsumer

    def setup():
        fleets = {name: _extras(build_fleet(name)) for name in ("a", "b")}
        return member("viewer-a", a="viewer"), fleets

    user, fleets = await sync_to_async(setup)()
    a, b = fleets["a"], fleets["b"]
    checks = {
        "page=plans": (f'id="plan-{a["plan"].pk}"', f'id="plan-{b["plan"].pk}"'),
        # The alert pages are fleet-wide (alerts/permissions.py): a cluster viewer's alerts
        # region stays empty; the API lists it the alerts of its clusters.
        "page=alerts": (None, "cluster=b"),
        f"page=node&node={b['nodes'][0].pk}": (None, "b-n0"),
    }
    for query, (wanted, unwanted) in checks.items():
        if query.split("&")[0].removeprefix("page=") not in PAGES:
            continue  # that page has no live region in this build
        ws = WebsocketCommunicator(LiveTopologyConsumer.as_asgi(), f"/ws/live/?{query}")
        ws.scope["user"] = user
        connected, _ = await ws.connect(timeout=WAIT_S)
        assert connected
        try:
            html = await ws.receive_from(timeout=WAIT_S)
            assert unwanted not in html, query
            if wanted:
                assert wanted in html, query
        finally:
            await ws.disconnect()
    await asyncio.sleep(0)


# --- Prometheus SD and /metrics ----------------------------------------------------------------
def _sd_clusters(response) -> set[str]:
    assert response.status_code == 200, response.content
    return {g["labels"]["cluster"] for g in response.json()}


def test_sd_lists_only_visible_clusters(fleets, settings):
    settings.METRICS_TOKEN = "sd-secret"
    url = "/api/v1/prometheus/targets"
    viewer = member("viewer-a", a="viewer")
    assert _sd_clusters(session(viewer).get(url)) == {"a"}
    _, raw = token_client(viewer, "read")
    assert _sd_clusters(APIClient().get(url, HTTP_AUTHORIZATION=f"Bearer {raw}")) == {"a"}
    assert _sd_clusters(session(viewer).get(url + "?cluster=b")) == set()
    everything = APIClient().get(url, HTTP_AUTHORIZATION="Bearer sd-secret")
    assert _sd_clusters(everything) == {"a", "b"}
    assert _sd_clusters(session(make_user("viewer", "fleet-viewer")).get(url)) == {"a", "b"}
    assert APIClient().get(url, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert APIClient().get(url).status_code == 401
    assert session(make_user(None, "nobody")).get(url).json() == []


def test_metrics_are_scoped_for_cluster_roles(fleets, settings):
    settings.METRICS_TOKEN = "m-secret"
    viewer = member("viewer-a", a="viewer")
    _, raw = token_client(viewer, "read")
    scoped = APIClient().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert scoped.status_code == 200
    text = scoped.content.decode()
    assert 'pdplane_gateway_version_lag{cluster="a"' in text
    assert 'cluster="b"' not in text
    assert "pdplane_agent_reports_ingested_total" not in text  # fleet-wide totals left out
    full = APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer m-secret").content.decode()
    assert 'cluster="b"' in full and "pdplane_agent_reports_ingested_total" in full
    assert APIClient().get("/metrics").status_code == 401
    assert APIClient().get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    nobody = APIClient()
    nobody.force_login(make_user(None, "nobody"))
    assert nobody.get("/metrics").status_code == 403


def test_set_role_and_memberships_combine():
    from controlplane.topology.models import Cluster

    a, b = Cluster.objects.create(name="a"), Cluster.objects.create(name="b")
    user = member("u", a="admin")
    assert access.role_on(user, a) == "admin" and access.role_on(user, b) is None
    set_role(user, "viewer")
    assert access.role_on(user, b) == "viewer" and access.role_on(user, a) == "admin"
    assert set(access.visible_clusters(user).values_list("name", flat=True)) == {"a", "b"}
    set_role(user, None)
    assert list(access.visible_clusters(user, "write").values_list("name", flat=True)) == ["a"]


def test_cluster_paths_resolve():
    """Every model listed in access.CLUSTER_PATHS exists and reaches a Cluster by its path
    (a renamed field elsewhere must fail here, not as a 500 for cluster members)."""
    from django.apps import apps

    from controlplane.topology.models import Cluster

    for label, path in access.CLUSTER_PATHS.items():
        model = apps.get_model(label)
        lookup = "pk__in" if path == "pk" else f"{path}__in"
        str(model.objects.filter(**{lookup: [1]}).query)  # raises FieldError if broken
        if path != "pk":
            field = model._meta.get_field(path.split("__")[0])
            target = field.related_model
            for hop in path.split("__")[1:]:
                target = target._meta.get_field(hop).related_model
            assert target is Cluster, label


def test_token_page_for_a_cluster_member(client):
    from controlplane.topology.models import Cluster

    user = member("viewer-w")
    access.set_cluster_role(Cluster.objects.create(name="w"), "viewer", user=user)
    client.force_login(user)
    page = client.get("/accounts/tokens/")
    assert page.status_code == 200 and "<strong>viewer</strong> on w" in page.content.decode()
    client.force_login(make_user(None, "nobody"))
    assert client.get("/accounts/tokens/").status_code == 403
