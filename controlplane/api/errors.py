"""One JSON error body everywhere under /api/::

    {"error": {"code": "invalid", "message": "…", "fields": {"hostname": ["…"]}}}

``fields`` is present (possibly empty) on every error; ``non_field_errors`` holds errors
that belong to no single field. Bad input is a 4xx with reasons, never a 500.
"""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler

log = logging.getLogger(__name__)


class PreconditionFailed(exceptions.APIException):
    status_code = status.HTTP_412_PRECONDITION_FAILED
    default_detail = "The object changed since you read it (If-Match does not match its ETag)."
    default_code = "precondition_failed"


class IdempotencyKeyMismatch(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = (
        "This Idempotency-Key was already used with a different request; "
        "use a new key for a new request."
    )
    default_code = "idempotency_key_mismatch"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _flatten(detail) -> dict:
    if isinstance(detail, dict):
        return {k: _flatten_list(v) for k, v in detail.items()}
    return {"non_field_errors": _flatten_list(detail)}


def _flatten_list(value):
    if isinstance(value, list | tuple):
        out = []
        for item in value:
            out.extend(_flatten_list(item) if isinstance(item, list | tuple) else [_text(item)])
        return out
    if isinstance(value, dict):
        return [f"{k}: {'; '.join(_flatten_list(v))}" for k, v in value.items()]
    return [_text(value)]


def _text(value) -> str:
    return str(value)


def exception_handler(exc, context):
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(as_serializer_error(exc))
    elif isinstance(exc, IntegrityError):
        # Serializers validate uniqueness; this is the race between two writers.
        log.info("integrity error turned into 409: %s", exc)
        exc = Conflict("The change conflicts with another object (uniqueness or reference).")
    elif isinstance(exc, DataError):
        # A value the serializers let through but the database refuses (range, encoding).
        log.warning("data error on bad input turned into 400: %s", exc)
        exc = exceptions.ValidationError({"non_field_errors": ["The database rejected a value."]})
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a real bug: Django's 500 handler (JSON under /api/) takes over
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        message = "Invalid input."
        if list(fields) == ["non_field_errors"]:
            message = "; ".join(fields["non_field_errors"])
        body = error_body("invalid", message, fields)
    else:
        detail = getattr(exc, "detail", str(exc))
        code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
        body = error_body(str(code), _text(detail))
    response.data = body
    return response


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def handler404(request, exception=None):
    if _is_api(request):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def handler500(request):
    if _is_api(request):
        return JsonResponse(
            error_body("server_error", "Internal server error; it has been logged."), status=500
        )
    from django.views.defaults import server_error

    return server_error(request)


def response_for(exc: exceptions.APIException) -> Response:
    """An error Response outside the exception-handler path (used by mixins)."""
    return Response(error_body(exc.default_code, str(exc.detail)), status=exc.status_code)
