"""Derived records are read-only in the admin: no "Add", no edit form that saves."""

import pytest
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["planner/plan", "routing/routingtableversion"])
def test_derived_records_have_no_add(client, path):
    admin = get_user_model().objects.create_superuser("root", password="pw-123456789")
    client.force_login(admin)
    listing = client.get(f"/admin/{path}/")
    assert listing.status_code == 200
    assert f"/admin/{path}/add/" not in listing.content.decode()
    assert client.get(f"/admin/{path}/add/").status_code == 403
