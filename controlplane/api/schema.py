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


# One tag per resource (the first path segment after /api/v1/), described here; the
# postprocessing hook below puts the descriptions into the schema's top-level "tags".
TAGS = {
    "clusters": "Clusters: the unit of scheduling, routing tables and policies.",
    "fabrics": "Network fabrics of a cluster (transport, RDMA, line rate).",
    "nodes": "Machines that run engines; status comes from their agent's reports.",
    "gpus": "GPUs of each node as its agent inventories them (NVLink group, memory).",
    "nics": "Network interfaces of each node (transport, RDMA, line rate).",
    "served-models": "Models served in a cluster, with the KV-cache facts the planner uses.",
    "workers": "Engine processes: one served model on some GPUs, in a prefill, decode or "
               "aggregated role; drain and resume here.",
    "gateways": "Request gateways of a cluster and the routing-table version each applied.",
    "policies": "Latency targets, routing weights and rebalancing rules (cluster default "
                "and per-model overrides; unset fields inherit).",
    "audit": "The audit log: every change and action, newest first.",
    "tokens": "API tokens (the secret is shown once, at creation).",
    "cluster-memberships": "Per-cluster roles of users and tokens.",
    "routing-tables": "Published routing-table versions (derived; read-only).",
    "plans": "Planner proposals with their predictions; operators approve or reject.",
    "what-if": "The planner's cost model for a hypothetical fleet and load (no side effects).",
    "alerts": "Open and past alerts.",
    "alert-rules": "Overrides of the built-in alert rules' thresholds per cluster.",
    "silences": "Silences: matching alerts notify nobody until they end.",
    "webhook-endpoints": "Where alert notifications are delivered (signed webhooks).",
    "webhook-deliveries": "Each notification's delivery attempts and outcome.",
}


def resource_tag(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api" and parts[1].startswith("v"):
        return parts[2]
    return parts[0] if parts else "api"


def add_tag_descriptions(result, generator, request, public):
    """drf-spectacular postprocessing hook: describe every tag the operations use."""
    used = sorted({t for item in result.get("paths", {}).values() for op in item.values()
                   if isinstance(op, dict) for t in op.get("tags", [])})
    result["tags"] = [{"name": t, **({"description": TAGS[t]} if t in TAGS else {})}
                      for t in used]
    return result


class PdplaneAutoSchema(AutoSchema):
    def get_tags(self):
        return [resource_tag(self.path)]

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
