"""OpenAPI generation: every operation documents the shared error body and the error
statuses it can answer with, so clients (and schemathesis) know what to expect."""

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


ERROR_STATUSES = {
    "400": "Invalid input (field errors in error.fields)",
    "401": "Missing or invalid credentials",
    "403": "Role or token scope too low",
    "404": "No such object (or not visible to you)",
    "405": "Method not allowed",
    "409": "Conflicts with the current state",
    "412": "If-Match does not match the current ETag",
    "415": "Unsupported media type (send application/json)",
    "422": "Idempotency-Key reused with a different request",
    "503": "A backing service (live state) is unavailable",
}


class PdplaneAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code, description in ERROR_STATUSES.items():
            if code not in responses:
                body = self._get_response_for_code(ErrorSerializer, code, direction=direction)
                body["description"] = description
                responses[code] = body
        return responses
