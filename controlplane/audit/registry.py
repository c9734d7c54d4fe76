"""Which models are audited: a list of labels, so models that land later are covered
without importing them here. ``"app_label"`` audits every model of the app;
``"app_label.ModelName"`` one model. Other apps can also call :func:`register`.
"""

from __future__ import annotations

AUDITED = {
    "topology",
    "policies",
    "accounts.APIToken",
    "auth.User",
    "auth.Group",
    "planner",
    "routing",
    "alerts",
}

# High-volume or bookkeeping models that are never worth a change record.
NOT_AUDITED = {
    "audit.changerecord",
    "api.idempotencykey",
    "sessions.session",
    "admin.logentry",
    "contenttypes.contenttype",
    "auth.permission",
    # the outbox and its attempt log: they have their own history pages
    "outbox.message",
    "outbox.attempt",
    "routing.gatewaydelivery",
    "alerts.alert",
    "alerts.alertgroup",
    "alerts.evaluatormemory",
    "alerts.delivery",
    "planner.modelplannerstate",  # rewritten by every planning cycle
}

# Fields that change on their own (heartbeats, bookkeeping): an update touching only these
# is not recorded, and they are left out of before/after.
VOLATILE_FIELDS = {"updated", "last_seen", "last_used_at", "last_ack_at", "last_login"}

# Fields whose value never goes into the log: these names, and any name ending in
# "secret", "_hash" or "password" (previous_secret, agent_token_hash, …).
SECRET_FIELDS = {"password", "secret", "token_hash", "agent_token_hash"}
SECRET_SUFFIXES = ("secret", "_hash", "password")


def is_secret(field_name: str) -> bool:
    return field_name in SECRET_FIELDS or field_name.endswith(SECRET_SUFFIXES)

_extra: set[str] = set()
_excluded: set[str] = set()


def register(model_or_label, *, exclude: bool = False) -> None:
    """Audit (or stop auditing) a model by class or ``"app_label.ModelName"`` label."""
    label = model_or_label if isinstance(model_or_label, str) else model_or_label._meta.label
    (_excluded if exclude else _extra).add(label.lower())


def is_audited(model) -> bool:
    if model.__module__ == "__fake__":
        return False  # historical models inside migrations: the log may not exist yet
    meta = model._meta
    label = meta.label_lower
    if label in NOT_AUDITED or label in _excluded or meta.auto_created:
        return False
    audited = {x.lower() for x in AUDITED} | _extra
    return label in audited or meta.app_label in audited
