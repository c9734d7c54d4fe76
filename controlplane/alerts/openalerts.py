"""The open alerts table's context, shared by the alert page (alerts.views) and the
dashboard's live fan-out (dashboard.liveregions) — a module of its own so neither of those
has to import the other."""

from __future__ import annotations

from controlplane.accounts.access import restrict

from .models import Alert
from .permissions import flags


def open_alerts_context(user, fingerprint: str = "") -> dict:
    """The open alerts table; the dashboard's live fan-out re-renders it (liveregions)."""
    # Scoped: only alerts of clusters ``user`` can see (this also feeds the live fan-out).
    open_alerts = restrict(Alert.objects.filter(is_open=True), user).order_by(
        "status", "-severity", "rule")
    if fingerprint:
        open_alerts = open_alerts.filter(fingerprint=fingerprint)
    return {**flags(user), "open_alerts": open_alerts}
