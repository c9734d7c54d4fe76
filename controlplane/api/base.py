"""Base classes every API viewset builds on: roles.restrict() on every queryset, brief
serializers on ``?brief=1``, ETag/If-Match on detail writes, Idempotency-Key on creates."""

from __future__ import annotations

from functools import cache

from rest_framework import viewsets

from controlplane.accounts.roles import READ, restrict

from . import serializers as s
from .mixins import ETagMixin, idempotent
from .permissions import request_token


def _is_brief(request) -> bool:
    return request is not None and request.query_params.get("brief", "").lower() in {
        "1", "true", "yes"}


@cache
def _brief(full, extra):
    return s.brief_serializer(full, extra)


class RestrictedMixin:
    """Lists and lookups go through roles.restrict(); brief serializer on ``?brief=1``."""

    brief_fields: tuple[str, ...] = ()
    filter_fields: dict[str, str] = {}

    def get_queryset(self):
        return restrict(
            super().get_queryset(), self.request.user, READ, request_token(self.request)
        )

    def is_brief(self) -> bool:
        return self.action in {"list", "retrieve"} and _is_brief(self.request)

    def get_serializer_class(self):
        full = super().get_serializer_class()
        if self.is_brief() and issubclass(full, s.ModelCleanSerializer):
            return _brief(full, self.brief_fields)
        return full


class PdplaneModelViewSet(RestrictedMixin, ETagMixin, viewsets.ModelViewSet):
    @idempotent
    def create(self, request, *args, **kwargs):
        return super().create(request, *args, **kwargs)
