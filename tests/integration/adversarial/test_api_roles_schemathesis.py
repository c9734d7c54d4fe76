"""schemathesis over every API operation, as an admin and as a viewer (in-process WSGI,
PostgreSQL): no 5xx for either, and no write of a viewer is accepted.

tests/integration/test_api_schema.py checks schema conformance as admin; this module is the
adversarial part: generated (often hostile) input for both roles, bounded in examples.
"""

import pytest
from django.db import transaction
from hypothesis import HealthCheck, Phase, settings
from schemathesis import checks

from tests.integration.api_support import build_fleet, make_user, token_client
from tests.integration.test_api_schema import schema, wsgi_app  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

MAX_EXAMPLES = 2
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
# POSTs that change nothing shared: a what-if computes a plan without storing it, and any
# signed-in user may create an API token for themselves (bounded by their own role).
VIEWER_MAY_POST = {"/api/v1/what-if/", "/api/v1/tokens/"}


@pytest.fixture
def tokens():
    build_fleet()
    return {role: token_client(make_user(role, f"st-{role}"), scope="admin")[1]
            for role in ("admin", "viewer")}


def _call(case, app, token):
    # Each request in a savepoint that is rolled back: every example sees the same fleet.
    with transaction.atomic():
        response = case.call(app=app, headers={"Authorization": f"Bearer {token}"})
        transaction.set_rollback(True)
    return response


HYPOTHESIS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))


# Reads as admin are covered by test_api_schema.py (conformance, 5 examples each).
@schema.include(method=sorted(UNSAFE)).parametrize()
@HYPOTHESIS
def test_admin_writes_get_no_5xx(case, tokens, wsgi_app):  # noqa: F811
    response = _call(case, wsgi_app, tokens["admin"])
    case.validate_response(response, checks=[checks.not_a_server_error])


@schema.parametrize()
@HYPOTHESIS
def test_viewer_gets_no_5xx_and_no_write(case, tokens, wsgi_app):  # noqa: F811
    response = _call(case, wsgi_app, tokens["viewer"])
    case.validate_response(response, checks=[checks.not_a_server_error])
    if case.method.upper() in UNSAFE and case.path not in VIEWER_MAY_POST:
        assert not 200 <= response.status_code < 300, (
            f"viewer {case.method} {case.formatted_path} -> {response.status_code}")
