"""One error body; model validation through the API; no 500 on bad input."""

import pytest

from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin():
    return token_client(make_user("admin"))[0]


def _error(response, status):
    assert response.status_code == status, response.content
    body = response.json()["error"]
    assert set(body) == {"code", "message", "fields"}
    return body


def test_unknown_api_path_is_json_404(admin):
    body = _error(admin.get("/api/v1/no-such-thing/"), 404)
    assert body["code"] == "not_found"


def test_missing_object_is_json_404(admin):
    assert _error(admin.get("/api/v1/nodes/999999/"), 404)["code"] == "not_found"


def test_field_errors_are_named(admin):
    fleet = build_fleet()
    body = _error(admin.post("/api/v1/nodes/", {"cluster": fleet["cluster"].pk}, format="json"),
                  400)
    assert body["code"] == "invalid" and "hostname" in body["fields"]


def test_worker_gpu_rules_are_enforced(admin):
    fleet = build_fleet()
    other_node_gpu = fleet["gpus"][-1]
    body = _error(admin.post("/api/v1/workers/", {
        "served_model": fleet["model"].pk, "node": fleet["nodes"][0].pk, "name": "e1",
        "tp_size": 1, "api_url": "http://127.0.0.1:8001", "gpus": [other_node_gpu.pk],
    }, format="json"), 400)
    assert "gpus" in body["fields"]
    taken = _error(admin.post("/api/v1/workers/", {
        "served_model": fleet["model"].pk, "node": fleet["nodes"][0].pk, "name": "e1",
        "tp_size": 1, "api_url": "http://127.0.0.1:8001", "gpus": [fleet["gpus"][0].pk],
    }, format="json"), 400)
    assert "already taken" in taken["fields"]["gpus"][0]


def test_model_clean_runs_on_update(admin):
    fleet = build_fleet()
    body = _error(admin.patch(f"/api/v1/served-models/{fleet['model'].pk}/",
                              {"kv_dtype_bytes": 0}, format="json"), 400)
    assert "kv_dtype_bytes" in body["fields"]


def test_policy_validation_and_unique_default(admin):
    fleet = build_fleet()
    bad = _error(admin.patch(f"/api/v1/policies/{fleet['policy'].pk}/", {"attainment": 2},
                             format="json"), 400)
    assert "attainment" in bad["fields"]
    dup = admin.post("/api/v1/policies/", {"cluster": fleet["cluster"].pk}, format="json")
    assert dup.status_code == 400


def test_bad_filters_and_paging_are_not_500(admin):
    build_fleet()
    assert admin.get("/api/v1/nodes/?cluster_id=abc").status_code == 400
    assert admin.get("/api/v1/nodes/?status=bogus").status_code == 400
    assert admin.get("/api/v1/gpus/?missing=maybe").status_code == 400
    assert admin.get("/api/v1/nodes/?offset=99999999999999999999999").status_code == 200
    assert admin.get("/api/v1/nodes/?hostname=a%00b").status_code == 400
    assert admin.get("/api/v1/nodes/?ordering=nope").status_code == 200


def test_nul_and_huge_numbers_in_body_are_400(admin):
    fleet = build_fleet()
    cluster = fleet["cluster"].pk
    assert admin.post("/api/v1/nodes/", {"cluster": cluster, "hostname": "a\x00b"},
                      format="json").status_code == 400
    assert admin.post("/api/v1/nodes/", {"cluster": 10**30, "hostname": "x"},
                      format="json").status_code == 400
    nul_label = {"cluster": cluster, "hostname": "x", "labels": {"a\x00": "b"}}
    assert admin.post("/api/v1/nodes/", nul_label, format="json").status_code == 400


def test_effective_policy_shows_sources(admin):
    fleet = build_fleet()
    response = admin.get(f"/api/v1/served-models/{fleet['model'].pk}/effective-policy/")
    assert response.status_code == 200
    data = response.json()
    assert data["policy"]["ttft_p95_ms"] == 800
    assert data["sources"]["ttft_p95_ms"] == "cluster"
    assert data["sources"]["itl_p95_ms"] == "default"


def test_kv_bytes_per_token_is_read_only(admin):
    fleet = build_fleet()
    url = f"/api/v1/served-models/{fleet['model'].pk}/"
    response = admin.patch(url, {"kv_bytes_per_token": 1}, format="json")
    assert response.status_code == 200
    assert response.json()["kv_bytes_per_token"] == 163_840


def test_request_id_is_echoed_or_generated(admin):
    response = admin.get("/api/v1/clusters/", HTTP_X_REQUEST_ID="abc-123")
    assert response["X-Request-Id"] == "abc-123"
    generated = admin.get("/api/v1/clusters/", HTTP_X_REQUEST_ID="bad id with spaces")
    assert len(generated["X-Request-Id"]) == 32


def test_brief_and_nested_refs(admin):
    fleet = build_fleet()
    full = admin.get("/api/v1/workers/").json()["results"][0]
    assert full["node"] == {"id": fleet["nodes"][0].pk, "display": fleet["nodes"][0].hostname}
    assert full["gpus"][0]["id"] == fleet["gpus"][0].pk
    brief = admin.get("/api/v1/workers/?brief=1").json()["results"][0]
    assert set(brief) == {"id", "display", "name", "state", "desired_role"}


def test_gateway_secret_is_write_only(admin):
    fleet = build_fleet()
    data = admin.get(f"/api/v1/gateways/{fleet['gateway'].pk}/").json()
    assert "secret" not in data
