"""The what-if advisor's JSON view."""

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_whatif_view_answers_with_arithmetic_and_rejects_bad_fields(client, django_user_model):
    assert client.get("/planner/whatif").status_code in (302, 401, 403)
    user = django_user_model.objects.create_user("viewer", password="x" * 12)
    client.force_login(user)
    assert client.get("/planner/whatif").status_code == 403  # logged in, but no role anywhere
    from controlplane.accounts.access import set_role

    set_role(user, "viewer")
    resp = client.get("/planner/whatif", {"gpu": "H200 NVL", "nodes": 4, "nvlink_group_size": 4,
                                          "nic_gbps": 400, "rdma": "true", "rate_rps": 20})
    assert resp.status_code == 200
    body = resp.json()
    assert body["candidates"][0]["layout"] == "aggregated"
    assert len(body["candidates"]) == 32
    assert any("400 G RDMA" in line for line in body["arithmetic"])
    bad = client.post("/planner/whatif", json.dumps({"nodes": -1, "warp": 9}),
                      content_type="application/json")
    assert bad.status_code == 400
    assert set(bad.json()["fields"]) == {"nodes", "warp"}
    worse = client.post("/planner/whatif", b"not json", content_type="application/json")
    assert worse.status_code == 400
