"""Query-string filters as django-filter FilterSets, shared by the API and the UI's lists.

A viewset declares ``filter_fields = {"cluster_id": "cluster_id", "status": "status"}``
(query parameter → ORM lookup); :func:`filterset_for` turns that into a FilterSet whose
filters are typed by the model field, so ``?cluster_id=abc`` is a field error (400), not a
500. A parameter given several times matches any of the values
(``?status=online&status=stale``). The dashboard's plans and audit pages filter with the
very same FilterSet classes as ``/api/v1/plans/`` and ``/api/v1/audit/``.
"""

from __future__ import annotations

from functools import cache

import django_filters
from django import forms
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import exceptions
from rest_framework.filters import BaseFilterBackend

_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _model_field(model, lookup: str):
    field = None
    for part in lookup.split("__"):
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            # "cluster_id" style attnames, and comparison suffixes (gte, lte, icontains)
            if field is None:
                field = next((f for f in model._meta.concrete_fields if f.attname == part), None)
            break
        if field.is_relation and field.related_model is not None:
            model = field.related_model
    return field


def _openapi_type(field) -> dict:
    if isinstance(field, models.BooleanField):
        return {"type": "boolean"}
    if isinstance(field, (models.ForeignKey, models.AutoField, models.IntegerField)):
        return {"type": "integer"}
    if isinstance(field, models.FloatField):
        return {"type": "number"}
    if isinstance(field, models.DateTimeField):
        return {"type": "string", "format": "date-time"}
    schema: dict = {"type": "string"}
    if getattr(field, "choices", None):
        schema["enum"] = [c[0] for c in field.choices]
    return schema


def _parse(field, raw: str):
    if isinstance(field, models.BooleanField):
        if raw.lower() not in _BOOL:
            raise ValueError("expected true or false")
        return _BOOL[raw.lower()]
    if isinstance(field, models.DateTimeField):
        value = parse_datetime(raw)
        if value is None:
            raise ValueError("expected an ISO 8601 date-time")
        # A time without an offset ("2026-01-01T00:00", what a datetime-local input sends)
        # means the server's time zone, as Django's own form fields read it; comparing a
        # naive value with aware rows would only warn and guess.
        if timezone.is_naive(value):
            value = timezone.make_aware(value)
        return value
    if isinstance(field, models.ForeignKey):
        field = field.target_field
    try:
        value = field.to_python(raw)
    except ValidationError as exc:
        raise ValueError(" ".join(exc.messages)) from None
    if isinstance(field, (models.AutoField, models.IntegerField)) and not (
        -(2**63) <= value < 2**63
    ):
        raise ValueError("out of range")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("NUL characters are not allowed")
    if getattr(field, "choices", None) and value not in {c[0] for c in field.choices}:
        raise ValueError(f"expected one of {', '.join(str(c[0]) for c in field.choices)}")
    return value


class _AnyOfField(forms.Field):
    """Every value of a repeated parameter, each parsed as the model field would."""

    widget = forms.MultipleHiddenInput  # reads QueryDict.getlist

    def __init__(self, model_field, **kwargs):
        self.model_field = model_field
        kwargs["required"] = False
        super().__init__(**kwargs)

    def clean(self, value):
        if isinstance(value, str):  # a plain dict (the live views' parsed query), not a QueryDict
            value = [value]
        raws = [v for v in (value or []) if v != ""]
        try:
            return [_parse(self.model_field, raw) for raw in raws]
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


class AnyOfFilter(django_filters.Filter):
    """``?p=a`` → ``lookup=a``; ``?p=a&p=b`` → ``lookup__in=[a, b]``."""

    field_class = _AnyOfField

    def filter(self, qs, value):
        if not value:
            return qs
        if len(value) == 1:
            return qs.filter(**{self.field_name: value[0]})
        return qs.filter(**{f"{self.field_name}__in": value})


@cache
def _filterset(model, fields: tuple[tuple[str, str], ...]) -> type[django_filters.FilterSet]:
    declared = {
        param: AnyOfFilter(field_name=lookup, model_field=_model_field(model, lookup))
        for param, lookup in fields
    }
    meta = type("Meta", (), {"model": model, "fields": []})
    return type(f"{model.__name__}FilterSet", (django_filters.FilterSet,),
                {**declared, "Meta": meta})


def filterset_for(model, filter_fields: dict[str, str]) -> type[django_filters.FilterSet]:
    """The one FilterSet class for ``model`` and these parameters (cached: same class for
    the API viewset and the dashboard page that declare the same fields)."""
    return _filterset(model, tuple(filter_fields.items()))


def apply_filters(queryset, filter_fields: dict[str, str], query):
    """(filtered queryset, {param: [message]} errors) — for pages that show errors inline."""
    fs = filterset_for(queryset.model, filter_fields)(query, queryset=queryset)
    if not fs.is_valid():
        return queryset.none(), {k: list(v) for k, v in fs.errors.items()}
    return fs.qs, {}


class FieldFilterBackend(BaseFilterBackend):
    def filter_queryset(self, request, queryset, view):
        declared = getattr(view, "filter_fields", None) or {}
        if not declared:
            return queryset
        filtered, errors = apply_filters(queryset, declared, request.query_params)
        if errors:
            raise exceptions.ValidationError(errors)
        return filtered

    def get_schema_operation_parameters(self, view):
        declared = getattr(view, "filter_fields", None) or {}
        model = getattr(getattr(view, "queryset", None), "model", None)
        params = []
        for param, lookup in declared.items():
            field = _model_field(model, lookup) if model is not None else None
            params.append(
                {
                    "name": param,
                    "required": False,
                    "in": "query",
                    "description": f"Filter on {lookup}",
                    "schema": _openapi_type(field) if field is not None else {"type": "string"},
                }
            )
        return params
