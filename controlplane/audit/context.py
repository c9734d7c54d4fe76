"""Who is changing things right now: the actor and request id of the current context.

Held in context variables, so they follow a request through sync and async code and
never leak between threads or tasks. Set them with:

- the HTTP middleware (:mod:`controlplane.audit.middleware`) — the logged-in user or the
  API token, plus the request id from ``X-Request-Id``;
- ``with actor("planner"):`` — a named system actor (planner, celery task, …);
- ``with actor_node(node):`` — a node's agent (inventory changes it reports);
- ``with actor_user(user, token=None):`` — a user outside HTTP (management commands).

Each context manager also starts a new request id (unless ``request_id`` is given) that ties
together every change made inside it. Without any context the actor is ``system``.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import uuid
from dataclasses import dataclass

USER = "user"
TOKEN = "token"
NODE = "node"
SYSTEM = "system"
ACTOR_KINDS = (USER, TOKEN, NODE, SYSTEM)


@dataclass(frozen=True)
class Actor:
    kind: str
    name: str
    user_id: int | None = None
    token_id: int | None = None
    node_id: int | None = None


SYSTEM_ACTOR = Actor(SYSTEM, "system")

# The actor is either an Actor or a zero-argument callable resolving one lazily: the HTTP
# middleware cannot know the user yet when DRF authenticates a token later in the view.
_actor: contextvars.ContextVar = contextvars.ContextVar("pdplane_audit_actor", default=None)
_request_id: contextvars.ContextVar = contextvars.ContextVar(
    "pdplane_audit_request_id", default=None
)

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def new_request_id() -> str:
    return uuid.uuid4().hex


def clean_request_id(value: str | None) -> str:
    """The caller's request id if it is sane (≤ 64 chars of [A-Za-z0-9._:-]), else a new one."""
    if value and _REQUEST_ID_RE.match(value):
        return value
    return new_request_id()


def current_actor() -> Actor:
    value = _actor.get()
    if value is None:
        return SYSTEM_ACTOR
    if callable(value):
        return value() or SYSTEM_ACTOR
    return value


def current_request_id() -> str | None:
    return _request_id.get()


def user_actor(user, token=None) -> Actor:
    if token is not None:
        return Actor(TOKEN, f"{user.get_username()} (token {token.prefix})", user.pk, token.pk)
    if user is not None and getattr(user, "is_authenticated", False):
        return Actor(USER, user.get_username(), user.pk)
    return Actor(USER, "anonymous")


@contextlib.contextmanager
def _bind(value, request_id: str | None):
    actor_token = _actor.set(value)
    rid_token = _request_id.set(request_id or new_request_id())
    try:
        yield
    finally:
        _request_id.reset(rid_token)
        _actor.reset(actor_token)


def actor(name: str, *, request_id: str | None = None):
    """A named system actor: ``with actor("planner"):`` or ``actor("celery:prune")``."""
    return _bind(Actor(SYSTEM, name), request_id)


def actor_node(node, *, request_id: str | None = None):
    """Changes reported by ``node``'s agent (inventory sync, status)."""
    return _bind(Actor(NODE, str(node), node_id=node.pk), request_id)


def actor_user(user, token=None, *, request_id: str | None = None):
    return _bind(user_actor(user, token), request_id)


def bind_lazy(resolve, request_id: str):
    """For the middleware: the actor is computed when the first change is recorded."""
    return _bind(resolve, request_id)
