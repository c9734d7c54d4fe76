"""Live regions: how every page other than topology stays current.

A page names its regions — an element id and the partial template that renders it — and
one context builder. The browser's websocket (controlplane.dashboard.consumers) asks for
them again after a hint (telemetry, a plan/routing/alert change) and at least every
``REFRESH_S``; only regions whose HTML changed since the last send go out, as htmx
out-of-band swaps. The polling fallback (``/live/poll?page=…``) returns the same fragments.

Region templates render their own root element with the region's id and, when ``oob`` is
set, ``hx-swap-oob="true"``.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlencode

from django.template.loader import render_to_string

REFRESH_S = 5.0
# Query keys a page keeps in its live URL (filters and paging of list pages).
KEPT_KEYS = ("status", "page", "cluster", "model", "fingerprint", "node", "cluster_id",
             "served_model_id", "since")


def _models(user, query) -> dict:
    from .modelspage import models_context

    return models_context(user)


def _plans(user, query) -> dict:
    from .modelspage import plans_context

    return plans_context(user, query)


def _routing(user, query) -> dict:
    from .modelspage import routing_context

    return routing_context(user, query)


def _alerts(user, query) -> dict:
    from controlplane.alerts.openalerts import open_alerts_context
    from controlplane.alerts.permissions import READ, can

    if not can(user, READ):
        return None
    return open_alerts_context(user, query.get("fingerprint", ""))


def _node(user, query) -> dict:
    from .nodepage import node_live_context

    return node_live_context(user, query.get("node", ""))


# page → (context builder, [(region id or id prefix, template)])
PAGES = {
    "models": (_models, [("models-live", "dashboard/_models_live.html")]),
    "plans": (_plans, [("plans-live", "dashboard/_plans_live.html")]),
    "routing": (_routing, [("routing-live", "dashboard/_routing_live.html")]),
    "alerts": (_alerts, [("alerts-live", "alerts/_open_alerts.html")]),
    "node": (_node, [("node-card", "dashboard/_node_card.html"),
                     ("engines-live", "dashboard/_engines_live.html")]),
}


def live_urls(page: str, query) -> dict:
    """The websocket and poll URLs a page template puts on its ``#live`` element."""
    kept = urlencode({k: query.get(k) for k in KEPT_KEYS if query.get(k)})
    suffix = f"?page={page}" + (f"&{kept}" if kept else "")
    return {"ws_url": "/ws/live/" + suffix, "poll_url": "/live/poll" + suffix}


def render_regions(page: str, user, query, csrf_token: str = "") -> dict[str, str]:
    """{region id: HTML with hx-swap-oob} for ``page`` as ``user`` sees it now."""
    builder, regions = PAGES[page]
    context = builder(user, query)
    if context is None:  # the object is gone or not visible: nothing to update
        return {}
    context = {**context, "oob": True, "user": user, "csrf_token": csrf_token}
    return {rid: render_to_string(template, context) for rid, template in regions}


def digest(html: str) -> bytes:
    return hashlib.blake2b(html.encode(), digest_size=16).digest()


def csrf_for_scope(scope) -> str:
    """A form token for forms inside live fragments, from the browser's CSRF cookie
    (websocket renders have no request; the masked secret is what {% csrf_token %} puts)."""
    from django.conf import settings
    from django.middleware.csrf import _mask_cipher_secret

    secret = (scope.get("cookies") or {}).get(settings.CSRF_COOKIE_NAME, "")
    if len(secret) != 32 or not secret.isalnum():
        return ""
    return _mask_cipher_secret(secret)
