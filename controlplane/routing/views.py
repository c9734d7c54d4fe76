"""Gateway pull: ``GET /routing/v1/clusters/<name>/table`` with ETag / If-None-Match.

Authentication is the gateway's own HMAC secret: headers ``X-Pdplane-Gateway`` (its name
in the cluster), ``X-Pdplane-Timestamp`` and ``X-Pdplane-Signature`` over
``"<ts>.GET.<path>."``. A gateway may report the version it runs in
``X-Pdplane-Applied-Version`` (as an xDS client does on reconnect); it is recorded.
"""

from __future__ import annotations

import logging
import time

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from controlplane.accounts.access import visible_clusters
from controlplane.topology.models import Gateway

from . import signing
from .builder import canonical_json
from .diff import diff_tables, summarize
from .models import RoutingTableVersion
from .service import gateway_lag, latest_table

log = logging.getLogger(__name__)


def _error(status: int, reason: str) -> JsonResponse:
    return JsonResponse({"error": reason}, status=status)


@require_GET
def table_pull(request, cluster_name: str):
    gateway_name = request.headers.get(signing.GATEWAY_HEADER, "")
    gateway = (
        Gateway.objects.filter(cluster__name=cluster_name, name=gateway_name)
        .select_related("cluster")
        .first()
    )
    if gateway is None:
        return _error(401, "unknown gateway or cluster")
    try:
        signing.verify(
            gateway.secret,
            request.headers.get(signing.TIMESTAMP_HEADER),
            request.headers.get(signing.SIGNATURE_HEADER),
            "GET",
            request.path,
            b"",
            now=time.time(),
        )
    except signing.SignatureError as exc:
        log.warning("table pull by %s refused: %s", gateway, exc.reason)
        return _error(401, exc.reason)
    reported = request.headers.get(signing.APPLIED_VERSION_HEADER, "")
    if reported.isdigit() and int(reported) != gateway.applied_table_version:
        Gateway.objects.filter(pk=gateway.pk).update(applied_table_version=int(reported))
    latest = latest_table(gateway.cluster_id)
    if latest is None:
        return _error(404, "no routing table has been published for this cluster yet")
    if request.headers.get("If-None-Match", "") == latest.etag:
        response = HttpResponse(status=304)
    else:
        response = HttpResponse(canonical_json(latest.body), content_type="application/json")
    response["ETag"] = latest.etag
    response["Cache-Control"] = "no-cache"
    return response


@staff_member_required
@require_GET
def table_diff(request, cluster_name: str):
    """Staff view: the changes between two stored versions (``?from=N&to=M``)."""
    # Scoped like the API: a cluster the staff user holds no role on is "no such cluster".
    cluster = visible_clusters(request.user).filter(name=cluster_name).first()
    if cluster is None:
        return _error(404, "no such cluster")
    versions = RoutingTableVersion.objects.filter(cluster=cluster)
    try:
        new_v = int(request.GET.get("to") or versions.values_list("version", flat=True).first())
        old_v = int(request.GET.get("from") or new_v - 1)
    except (TypeError, ValueError):
        return _error(400, "from and to must be version numbers")
    new = versions.filter(version=new_v).first()
    if new is None:
        return _error(404, f"no version {new_v}")
    old = versions.filter(version=old_v).first()
    changes = diff_tables(old.body if old else None, new.body)
    return JsonResponse(
        {"from": old_v if old else None, "to": new_v, "summary": summarize(changes),
         "changes": changes, "cause": new.cause, "actor": new.actor}
    )


@staff_member_required
@require_GET
def gateway_status(request, cluster_name: str):
    """Staff view: each gateway's applied version, lag, last ACK and last error."""
    # Scoped like the API: a cluster the staff user holds no role on is "no such cluster".
    cluster = visible_clusters(request.user).filter(name=cluster_name).first()
    if cluster is None:
        return _error(404, "no such cluster")
    latest = latest_table(cluster.pk)
    rows = []
    for gateway in Gateway.objects.filter(cluster=cluster).order_by("name"):
        rows.append({
            "name": gateway.name,
            "kind": gateway.kind,
            "url": gateway.url,
            "applied_version": gateway.applied_table_version,
            "lag": gateway_lag(gateway, latest),
            "last_ack_at": gateway.last_ack_at.isoformat() if gateway.last_ack_at else None,
            "last_error": gateway.last_error,
        })
    return JsonResponse({"cluster": cluster.name,
                         "latest_version": latest.version if latest else None,
                         "gateways": rows})
