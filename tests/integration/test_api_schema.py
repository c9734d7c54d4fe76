"""schemathesis against the live OpenAPI schema, in-process over WSGI with an admin token.

The schema is the one /api/schema/ serves (drf-spectacular's generator, called directly so
it exists at collection time). Every operation gets a bounded number of generated requests
against a small fleet, checked with schemathesis' defaults for call_and_validate: no 5xx,
and status code, content type, headers and body conform to the schema.
"""

import json

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, settings
from schemathesis import checks

from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db

MAX_EXAMPLES = 5
# What the acceptance asks: no 5xx, and status, content type, headers and body as documented.
# (positive_data_acceptance is left out: a schema-valid body may still name a missing object
# or break a business rule, and then a 400 is the right answer.)
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]


def _served_schema() -> dict:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(json.dumps(raw, default=str))


schema = schemathesis.openapi.from_dict(_served_schema())


def test_served_schema_matches_the_generated_one(client):
    make_user("viewer", "reader")
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="reader"))
    served = client.get("/api/schema/?format=json").json()
    assert served["paths"].keys() == _served_schema()["paths"].keys()
    from django.test import Client

    assert Client().get("/api/schema/").status_code == 401


def test_docs_ui_is_served_offline(client):
    client.force_login(make_user("viewer", "reader"))
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "drf_spectacular_sidecar/swagger-ui-dist" in html
    assert "cdn." not in html and "unpkg" not in html


@pytest.fixture
def wsgi_app():
    # A bare WSGI handler closes the database connection after each request, which would
    # end the test transaction; Django's test client disconnects the same signal.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def admin_token():
    build_fleet()
    return token_client(make_user("admin", "schemathesis"), scope="admin")[1]


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_schema(case, admin_token, wsgi_app):
    # Each request in its own savepoint, rolled back: the fleet stays the same for every
    # example, and one request's database error cannot leak into the next as it could not
    # in production (autocommit).
    with transaction.atomic():
        response = case.call(app=wsgi_app, headers={"Authorization": f"Bearer {admin_token}"})
        transaction.set_rollback(True)
    case.validate_response(response, checks=CHECKS)
