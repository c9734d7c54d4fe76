"""Nested references: written as a primary key, read as ``{"id", "display"}``."""

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers


class NestedRef(serializers.PrimaryKeyRelatedField):
    def use_pk_only_optimization(self):
        return False

    def to_representation(self, value):
        return {"id": value.pk, "display": str(value)}

    def to_internal_value(self, data):
        if isinstance(data, dict) and "id" in data:
            data = data["id"]  # accept the read form back, as NetBox does
        if isinstance(data, bool) or not isinstance(data, int | str):
            self.fail("incorrect_type", data_type=type(data).__name__)
        if isinstance(data, int) and not 0 < data < 2**63:
            self.fail("does_not_exist", pk_value=data)  # beyond bigint: no such row
        return super().to_internal_value(data)


REF_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "display": {"type": "string"}},
    "required": ["id", "display"],
}


class NestedRefExtension(OpenApiSerializerFieldExtension):
    target_class = "controlplane.api.fields.NestedRef"
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        schema = {"type": "integer"} if direction == "request" else dict(REF_SCHEMA)
        if self.target.allow_null:
            schema["nullable"] = True
        return schema
