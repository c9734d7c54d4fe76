"""Query-string filters declared per viewset, typed and validated (bad values → 400).

``filter_fields = {"cluster_id": "cluster_id", "status": "status", "hostname": "hostname"}``
maps a query parameter to an ORM lookup. The type is taken from the model field, so
``?cluster_id=abc`` is a field error, not a 500. A parameter given several times matches
any of the values (``?status=online&status=stale``).
"""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import models
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


class FieldFilterBackend(BaseFilterBackend):
    def filter_queryset(self, request, queryset, view):
        declared = getattr(view, "filter_fields", None) or {}
        errors, conditions = {}, models.Q()
        for param, lookup in declared.items():
            raws = request.query_params.getlist(param)
            if not raws:
                continue
            field = _model_field(queryset.model, lookup)
            try:
                values = [_parse(field, raw) for raw in raws]
            except ValueError as exc:
                errors[param] = [str(exc)]
                continue
            if len(values) == 1:
                conditions &= models.Q(**{lookup: values[0]})
            else:
                conditions &= models.Q(**{f"{lookup}__in": values})
        if errors:
            raise exceptions.ValidationError(errors)
        return queryset.filter(conditions)

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
