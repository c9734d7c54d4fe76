"""``/metrics`` and the Prometheus service-discovery endpoint, scoped like everything else.

Who may read them:

* ``Authorization: Bearer $METRICS_TOKEN`` (the scraper's shared secret): everything.
* a pdplane API token (``Bearer pdp_…``) or a logged-in session: the clusters that
  principal can see (controlplane/accounts/access.py). A fleet-wide role sees everything;
  a role on some clusters sees their targets and per-cluster gauges only.
* anyone else: ``/metrics`` stays open when ``METRICS_TOKEN`` is not set (single-team
  installs, as before); the SD list always needs one of the above.
"""

import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse

from controlplane.accounts.access import Access, access_for, restrict
from controlplane.accounts.roles import READ

from .metrics import exposition

FLEET_READ = Access(frozenset({READ}))


def _bearer(request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _scrape_access(request) -> Access | None:
    """The caller's access, or None when it presented no credential at all. A wrong
    credential is access to nothing, never a fallback to the open default."""
    given = _bearer(request)
    secret = getattr(settings, "METRICS_TOKEN", None)
    if given:
        if secret and hmac.compare_digest(given.encode(), secret.encode()):
            return FLEET_READ
        from controlplane.accounts.models import APIToken

        token = APIToken.authenticate(given)
        return access_for(token.user, token) if token is not None else Access()
    if request.user.is_authenticated:
        return access_for(request.user)
    return None


def _refused(status: int, code: str, message: str, as_json: bool):
    if as_json:
        return JsonResponse({"error": {"code": code, "message": message}}, status=status)
    return HttpResponse(message + "\n", status=status, content_type="text/plain")


def metrics_view(request):
    """Prometheus exposition (see the module docstring for who sees what)."""
    granted = _scrape_access(request)
    if granted is None:
        if getattr(settings, "METRICS_TOKEN", None):
            return _refused(401, "not_authenticated", "missing or wrong bearer token", False)
        granted = FLEET_READ
    if not granted.anywhere(READ):  # a wrong bearer token (401), or a session with no role
        if _bearer(request):
            return _refused(401, "not_authenticated", "missing or wrong bearer token", False)
        return _refused(403, "permission_denied", "your role does not allow 'read'", False)
    body, content_type = exposition(granted.cluster_ids(READ))
    return HttpResponse(body, content_type=content_type)


def prometheus_targets_view(request):
    """``GET /api/v1/prometheus/targets[?cluster=name]`` for Prometheus ``http_sd_configs``.

    Authorised by ``Authorization: Bearer $METRICS_TOKEN`` (Prometheus: ``authorization:
    {credentials: ...}``), a pdplane API token, or a logged-in session; the last two list
    only the clusters that principal can see.
    """
    from .sd import targets

    granted = _scrape_access(request)
    if granted is None or (_bearer(request) and not granted.anywhere(READ)):
        return _refused(401, "not_authenticated",
                        "log in or send Authorization: Bearer <METRICS_TOKEN or API token>",
                        True)
    visible = None
    if not granted.everywhere(READ):
        from controlplane.topology.models import Cluster

        visible = restrict(Cluster.objects.all(), granted, READ)
    return JsonResponse(targets(request.GET.get("cluster") or None, visible), safe=False)
