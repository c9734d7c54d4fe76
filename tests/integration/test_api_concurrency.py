"""ETag / If-Match (412 when stale) and Idempotency-Key (replay, mismatch, per user)."""

import pytest

from controlplane.api.models import IdempotencyKey
from controlplane.topology.models import Cluster, Worker
from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin():
    return token_client(make_user("admin"))[0]


def test_get_returns_etag_and_matching_if_match_writes(admin):
    cluster = Cluster.objects.create(name="c1")
    url = f"/api/v1/clusters/{cluster.pk}/"
    etag = admin.get(url)["ETag"]
    response = admin.patch(url, {"description": "one"}, format="json", HTTP_IF_MATCH=etag)
    assert response.status_code == 200
    assert response["ETag"] != etag
    assert admin.get(url)["ETag"] == response["ETag"]


def test_stale_if_match_is_412_and_changes_nothing(admin):
    cluster = Cluster.objects.create(name="c1")
    url = f"/api/v1/clusters/{cluster.pk}/"
    stale = admin.get(url)["ETag"]
    assert admin.patch(url, {"description": "first"}, format="json").status_code == 200
    response = admin.patch(url, {"description": "second"}, format="json", HTTP_IF_MATCH=stale)
    assert response.status_code == 412
    assert response.json()["error"]["code"] == "precondition_failed"
    cluster.refresh_from_db()
    assert cluster.description == "first"
    put = admin.put(url, {"name": "c1", "description": "third"}, format="json", HTTP_IF_MATCH=stale)
    assert put.status_code == 412
    delete = admin.delete(url, HTTP_IF_MATCH=stale)
    assert delete.status_code == 412
    assert Cluster.objects.filter(pk=cluster.pk).exists()


def test_if_match_star_and_list_of_tags(admin):
    cluster = Cluster.objects.create(name="c1")
    url = f"/api/v1/clusters/{cluster.pk}/"
    etag = admin.get(url)["ETag"]
    star = admin.patch(url, {"description": "a"}, format="json", HTTP_IF_MATCH="*")
    assert star.status_code == 200
    fresh = admin.get(url)["ETag"]
    both = f'{etag}, W/{fresh}'
    listed = admin.patch(url, {"description": "b"}, format="json", HTTP_IF_MATCH=both)
    assert listed.status_code == 200


def test_if_match_is_optional(admin):
    cluster = Cluster.objects.create(name="c1")
    assert admin.delete(f"/api/v1/clusters/{cluster.pk}/").status_code == 204


def test_idempotent_drain_replays_the_first_response():
    fleet = build_fleet()
    client, _ = token_client(make_user("operator"), scope="write")
    url = f"/api/v1/workers/{fleet['worker'].pk}/drain/"
    first = client.post(url, {"reason": "maint"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 200
    generation = Worker.objects.get(pk=fleet["worker"].pk).generation
    # Someone resumes in between; the retried drain must not act again.
    Worker.objects.filter(pk=fleet["worker"].pk).update(state="active")
    again = client.post(url, {"reason": "maint"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    worker = Worker.objects.get(pk=fleet["worker"].pk)
    assert worker.state == "active" and worker.generation == generation


def test_same_key_other_body_is_422():
    fleet = build_fleet()
    client, _ = token_client(make_user("operator"), scope="write")
    url = f"/api/v1/workers/{fleet['worker'].pk}/drain/"
    assert client.post(url, {"reason": "a"}, format="json",
                       HTTP_IDEMPOTENCY_KEY="k-2").status_code == 200
    response = client.post(url, {"reason": "b"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_mismatch"
    other_path = client.post(f"/api/v1/workers/{fleet['worker'].pk}/resume/", {"reason": "a"},
                             format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert other_path.status_code == 422


def test_keys_are_scoped_per_user_and_expire():
    fleet = build_fleet()
    alice, _ = token_client(make_user("operator", "alice"), scope="write")
    bob, _ = token_client(make_user("operator", "bob"), scope="write")
    url = f"/api/v1/workers/{fleet['worker'].pk}/drain/"
    assert alice.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="shared").status_code == 200
    response = bob.post(url, {"reason": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    assert response.status_code == 200 and "Idempotent-Replayed" not in response
    # After 24 h the key is forgotten: a different body is a new request, not a mismatch.
    from datetime import timedelta

    from django.utils import timezone

    IdempotencyKey.objects.update(created=timezone.now() - timedelta(hours=25))
    again = alice.post(url, {"reason": "new"}, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    assert again.status_code == 200 and "Idempotent-Replayed" not in again


def test_idempotent_create_does_not_duplicate(admin):
    body = {"name": "c9"}
    first = admin.post("/api/v1/clusters/", body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    second = admin.post("/api/v1/clusters/", body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert Cluster.objects.filter(name="c9").count() == 1


def test_failed_request_is_not_stored(admin):
    bad = admin.post("/api/v1/clusters/", {"name": "not a slug!"}, format="json",
                     HTTP_IDEMPOTENCY_KEY="retry-me")
    assert bad.status_code == 400
    good = admin.post("/api/v1/clusters/", {"name": "fixed"}, format="json",
                      HTTP_IDEMPOTENCY_KEY="retry-me")
    assert good.status_code == 201


def test_bad_idempotency_key_is_400(admin):
    response = admin.post("/api/v1/clusters/", {"name": "x"}, format="json",
                          HTTP_IDEMPOTENCY_KEY="x" * 300)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["error"]["fields"]
