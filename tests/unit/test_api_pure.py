"""Pure pieces of the API, roles and audit context (no database)."""

import threading

from controlplane.accounts import roles
from controlplane.api.errors import _flatten, error_body
from controlplane.api.mixins import _if_match_values, etag_for
from controlplane.audit import context


def test_etag_is_stable_and_order_independent():
    assert etag_for({"a": 1, "b": [1, 2]}) == etag_for({"b": [1, 2], "a": 1})
    assert etag_for({"a": 1}) != etag_for({"a": 2})
    tag = etag_for({"a": 1})
    assert tag.startswith('"') and tag.endswith('"') and len(tag) == 34


def test_if_match_parsing():
    assert _if_match_values('"x", W/"y" ,*') == {'"x"', '"y"', "*"}
    assert _if_match_values("") == set()


def test_error_flattening():
    assert _flatten({"a": ["x"], "b": {"c": ["y"]}}) == {"a": ["x"], "b": ["c: y"]}
    assert _flatten(["top"]) == {"non_field_errors": ["top"]}
    assert error_body("conflict", "m") == {"error": {"code": "conflict", "message": "m",
                                                     "fields": {}}}


def test_scope_never_widens_role():
    for role, allowed in roles.ROLE_ALLOWS.items():
        for scope, scope_allows in roles.SCOPE_ALLOWS.items():
            assert allowed & scope_allows <= allowed, (role, scope)
    assert roles.ROLE_ALLOWS["operator"] == {"read", "action"}
    assert roles.SCOPE_ALLOWS["write"] == {"read", "write", "action"}


def test_secret_field_names():
    from controlplane.audit.registry import is_secret

    assert all(map(is_secret, ["secret", "previous_secret", "agent_token_hash", "password"]))
    assert not any(map(is_secret, ["hostname", "secret_rotated_at", "token_id"]))


def test_request_id_cleaning():
    assert context.clean_request_id("abc-1.2:3_x") == "abc-1.2:3_x"
    for bad in (None, "", "has space", "x" * 65, "é"):
        generated = context.clean_request_id(bad)
        assert len(generated) == 32 and generated != bad


def test_actor_contexts_nest_and_reset():
    assert context.current_actor() == context.SYSTEM_ACTOR
    assert context.current_request_id() is None
    with context.actor("planner", request_id="r1"):
        assert context.current_actor().name == "planner"
        assert context.current_request_id() == "r1"
        with context.actor("celery:x"):
            assert context.current_actor().name == "celery:x"
            assert context.current_request_id() not in (None, "r1")
        assert context.current_actor().name == "planner"
    assert context.current_actor() == context.SYSTEM_ACTOR


def test_actor_does_not_leak_between_threads():
    seen = {}

    def other():
        seen["actor"] = context.current_actor()

    with context.actor("planner"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=5)
    assert seen["actor"] == context.SYSTEM_ACTOR


def test_lazy_actor_resolves_at_use():
    state = {"name": "first"}
    with context.bind_lazy(lambda: context.Actor("user", state["name"]), "rid"):
        state["name"] = "later"
        assert context.current_actor().name == "later"
