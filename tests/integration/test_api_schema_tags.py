"""The OpenAPI schema groups operations by resource, each tag described."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.api.schema import TAGS

pytestmark = pytest.mark.django_db


def test_operations_are_tagged_per_resource_with_descriptions(client):
    user = get_user_model().objects.create_superuser("schema", password="pw-123456789")
    client.force_login(user)
    schema = client.get("/api/schema/?format=json").json()
    tags = {t["name"]: t.get("description", "") for t in schema["tags"]}
    assert "v1" not in tags and {"nodes", "plans", "workers", "alerts"} <= set(tags)
    assert all(tags[name] for name in tags if name in TAGS)
    assert schema["paths"]["/api/v1/nodes/"]["get"]["tags"] == ["nodes"]
    assert schema["paths"]["/api/v1/plans/{id}/"]["get"]["tags"] == ["plans"]
    undescribed = [name for name in tags if not tags[name]]
    assert undescribed == []
