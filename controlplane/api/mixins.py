"""Optimistic concurrency (ETag / If-Match) and retry safety (Idempotency-Key).

ETag: a strong validator computed from the object's full representation, sent on every
detail read and write. ``If-Match`` is optional on PUT/PATCH/DELETE; when given and no
longer current, the write is refused with 412 (``*`` matches any). The check and the write
run in one transaction with the row locked, so two clients cannot both pass the check.

Idempotency-Key: on POST (creates and actions). A successful (2xx) response is stored per
user and key for 24 h; the same key with the same method, path and body returns the stored
response with ``Idempotent-Replayed: true``; with a different request it is a 422. Failed
requests are not stored, so they can be retried with the same key.
"""

from __future__ import annotations

import hashlib
import json
from functools import wraps

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from rest_framework import exceptions
from rest_framework.response import Response

from .errors import IdempotencyKeyMismatch, PreconditionFailed
from .models import IdempotencyKey


def etag_for(data) -> str:
    payload = json.dumps(data, sort_keys=True, cls=DjangoJSONEncoder, separators=(",", ":"))
    return '"' + hashlib.sha256(payload.encode()).hexdigest()[:32] + '"'


def _if_match_values(header: str) -> set[str]:
    values = set()
    for part in header.split(","):
        part = part.strip()
        if part.startswith("W/"):
            part = part[2:]
        if part:
            values.add(part)
    return values


class ETagMixin:
    """For ModelViewSets: ETag on retrieve/update, If-Match checked on update/destroy."""

    def _current_etag(self, instance) -> str:
        serializer = self.get_serializer_class()(instance, context=self.get_serializer_context())
        return etag_for(serializer.data)

    def _check_if_match(self, request):
        header = request.headers.get("If-Match")
        if header is None:
            return
        instance = self.get_object()
        # Lock the row until the write commits: the check and the write are one step.
        type(instance)._base_manager.select_for_update().filter(pk=instance.pk).first()
        instance = self.get_object()
        values = _if_match_values(header)
        if "*" not in values and self._current_etag(instance) not in values:
            raise PreconditionFailed()

    def retrieve(self, request, *args, **kwargs):
        response = super().retrieve(request, *args, **kwargs)
        if not self.is_brief():
            response["ETag"] = etag_for(response.data)
        return response

    def update(self, request, *args, **kwargs):
        with transaction.atomic():
            self._check_if_match(request)
            response = super().update(request, *args, **kwargs)
        response["ETag"] = etag_for(response.data)
        return response

    def destroy(self, request, *args, **kwargs):
        with transaction.atomic():
            self._check_if_match(request)
            return super().destroy(request, *args, **kwargs)


def _fingerprint(request) -> str:
    try:
        body = json.dumps(request.data, sort_keys=True, cls=DjangoJSONEncoder)
    except TypeError:
        body = repr(request.data)
    raw = f"{request.method}\n{request.path}\n{body}"
    return hashlib.sha256(raw.encode()).hexdigest()


def idempotent(view_method):
    """Decorate a POST handler (``def create(self, request, …)`` or an ``@action``)."""

    @wraps(view_method)
    def wrapper(self, request, *args, **kwargs):
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return view_method(self, request, *args, **kwargs)
        if not 1 <= len(key) <= 255 or not key.isprintable() or not key.isascii():
            raise exceptions.ValidationError(
                {"Idempotency-Key": ["Must be 1–255 printable ASCII characters."]}
            )
        fingerprint = _fingerprint(request)
        with transaction.atomic():
            stored = (
                IdempotencyKey.objects.select_for_update()
                .filter(user=request.user, key=key)
                .first()
            )
            live = IdempotencyKey.objects.live()
            if stored is not None and not live.filter(pk=stored.pk).exists():
                stored.delete()
                stored = None
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    raise IdempotencyKeyMismatch()
                replay = Response(stored.response_body, status=stored.response_status)
                replay["Idempotent-Replayed"] = "true"
                return replay
            response = view_method(self, request, *args, **kwargs)
            if 200 <= response.status_code < 300:
                # Two first tries racing: the loser's insert fails, its transaction (and
                # its effect) rolls back, and it answers 409 (errors.exception_handler).
                IdempotencyKey.objects.create(
                    user=request.user,
                    key=key,
                    method=request.method,
                    path=request.path[:500],
                    fingerprint=fingerprint,
                    response_status=response.status_code,
                    response_body=response.data,
                )
        return response

    return wrapper
