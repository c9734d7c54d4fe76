"""Base classes every API viewset builds on: access.restrict() on every queryset (objects
of clusters the caller cannot see are 404), related fields limited the same way, the
target cluster checked on creates and updates, brief serializers on ``?brief=1``,
ETag/If-Match on detail writes, Idempotency-Key on creates."""

from __future__ import annotations

from functools import cache

from rest_framework import relations, viewsets
from rest_framework.permissions import SAFE_METHODS

from controlplane.accounts import access
from controlplane.accounts.roles import READ

from . import serializers as s
from .mixins import ETagMixin, idempotent
from .permissions import check_write_target, request_access


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
        return access.restrict(super().get_queryset(), request_access(self.request), READ)

    def get_serializer(self, *args, **kwargs):
        serializer = super().get_serializer(*args, **kwargs)
        if self.request is not None and self.request.method not in SAFE_METHODS:
            scope_related_fields(serializer, request_access(self.request))
        return serializer

    def is_brief(self) -> bool:
        return self.action in {"list", "retrieve"} and _is_brief(self.request)

    def get_serializer_class(self):
        full = super().get_serializer_class()
        if self.is_brief() and issubclass(full, s.ModelCleanSerializer):
            return _brief(full, self.brief_fields)
        return full


def scope_related_fields(serializer, granted: access.Access) -> None:
    """Writable references to cluster-scoped rows accept only rows the caller can see, so
    an id from another cluster is "does not exist", exactly like an id that never was."""
    fields = getattr(serializer, "fields", None)
    if fields is None:
        return
    for field in fields.values():
        if isinstance(field, relations.ManyRelatedField):
            field = field.child_relation
        queryset = getattr(field, "queryset", None)
        if (isinstance(field, relations.RelatedField) and queryset is not None
                and access.is_cluster_scoped(queryset.model)):
            field.queryset = access.restrict(queryset, granted, READ)


class PdplaneModelViewSet(RestrictedMixin, ETagMixin, viewsets.ModelViewSet):
    @idempotent
    def create(self, request, *args, **kwargs):
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer):
        check_write_target(self.request, self, self.queryset.model, serializer.validated_data)
        super().perform_create(serializer)

    def perform_update(self, serializer):
        check_write_target(self.request, self, self.queryset.model, serializer.validated_data,
                           serializer.instance)
        super().perform_update(serializer)
