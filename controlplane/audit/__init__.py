"""Audit log. The API other code uses::

    from controlplane import audit

    with audit.actor("planner"):          # system actor for a task / service
        ...
    with audit.actor_node(node):          # changes reported by a node's agent
        ...
    audit.log_action(worker, "drain", {"reason": "maintenance"})

HTTP requests get their actor (user or token) and request id from the middleware.
"""

from .context import actor, actor_node, actor_user, current_actor, current_request_id


def log_action(instance, verb, data=None, before=None, after=None):
    """Record an action (drain, approve, trigger run…) on ``instance``; see recording.py."""
    from .recording import log_action as _log_action  # models load after this package

    return _log_action(instance, verb, data, before=before, after=after)


__all__ = [
    "actor",
    "actor_node",
    "actor_user",
    "current_actor",
    "current_request_id",
    "log_action",
]
