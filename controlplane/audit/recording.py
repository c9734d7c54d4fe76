"""Turning model instances into before/after JSON and writing change records."""

from __future__ import annotations

import json
import logging

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from .context import current_actor, current_request_id
from .models import ChangeAction, ChangeRecord
from .registry import VOLATILE_FIELDS, is_secret

log = logging.getLogger(__name__)
MASK = "********"
# A field value larger than this (JSON bytes) is summarised: a routing table body can be
# megabytes and lives in its own table already.
MAX_VALUE_BYTES = 16 * 1024


def snapshot(instance: models.Model) -> dict:
    """The instance's concrete fields (FKs as ids) as JSON-safe values; secrets masked."""
    data = {}
    for field in instance._meta.concrete_fields:
        if field.name in VOLATILE_FIELDS:
            continue
        value = field.value_from_object(instance)
        if is_secret(field.name):
            value = MASK if value else ""
        data[field.attname if field.is_relation else field.name] = value
    # Round-trip through JSON so dates, decimals and UUIDs become strings like the API's.
    for key, value in data.items():
        encoded = json.dumps(value, cls=DjangoJSONEncoder)
        if len(encoded) > MAX_VALUE_BYTES:
            data[key] = {"_omitted": f"{len(encoded)} bytes"}
    return json.loads(json.dumps(data, cls=DjangoJSONEncoder))


def _object_type(instance_or_model) -> str:
    return instance_or_model._meta.label_lower


def record_change(instance, action, before=None, after=None, verb="") -> ChangeRecord | None:
    """Write one change record for ``instance`` with the current actor and request id."""
    if action == ChangeAction.UPDATE and before == after:
        return None
    who = current_actor()
    try:
        repr_ = str(instance)[:200]
    except Exception:  # a __str__ that follows a deleted relation must not break the write
        repr_ = f"{type(instance).__name__} {instance.pk}"
    return ChangeRecord.objects.create(
        action=action,
        verb=verb[:64],
        object_type=_object_type(instance),
        object_id=str(instance.pk) if instance.pk is not None else "",
        object_repr=repr_,
        actor_kind=who.kind,
        actor_name=who.name[:200],
        user_id=who.user_id,
        token_id=who.token_id,
        node_id=who.node_id,
        request_id=current_request_id() or "",
        before=before,
        after=after,
    )


def log_action(instance, verb: str, data: dict | None = None, before=None, after=None):
    """Record an action on ``instance`` (drain, approve, trigger run…).

    ``data`` (arguments, reason) goes into ``after`` unless ``after`` is given.
    """
    if after is None:
        after = json.loads(json.dumps(data or {}, cls=DjangoJSONEncoder))
    return record_change(instance, ChangeAction.ACTION, before=before, after=after, verb=verb)
