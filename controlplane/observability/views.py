import hmac

from django.conf import settings
from django.http import HttpResponse

from .metrics import exposition


def metrics_view(request):
    """Prometheus exposition. Guarded by ``METRICS_TOKEN`` (bearer) when that is set."""
    token = getattr(settings, "METRICS_TOKEN", None)
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("missing or wrong bearer token\n", status=401,
                                content_type="text/plain")
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)


def _authorised(request) -> bool:
    token = getattr(settings, "METRICS_TOKEN", None)
    if request.user.is_authenticated:
        return True
    if not token:
        return False
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), token.encode())


def prometheus_targets_view(request):
    """``GET /api/v1/prometheus/targets[?cluster=name]`` for Prometheus ``http_sd_configs``.

    Authorised by a logged-in session or ``Authorization: Bearer $METRICS_TOKEN``
    (Prometheus: ``authorization: {credentials: ...}``).
    """
    from django.http import JsonResponse

    from .sd import targets

    if not _authorised(request):
        return JsonResponse(
            {"error": {"code": "not_authenticated",
                       "message": "log in or send Authorization: Bearer <METRICS_TOKEN>"}},
            status=401,
        )
    return JsonResponse(targets(request.GET.get("cluster") or None), safe=False)
