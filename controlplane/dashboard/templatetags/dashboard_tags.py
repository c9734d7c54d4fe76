import time

from django import template

register = template.Library()


def _number(value) -> float | None:
    """Template lookups of missing keys arrive as "" — treat them as "no data"."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@register.filter
def pct(fraction):
    """0.431 → "43%"; None → "no data"."""
    fraction = _number(fraction)
    if fraction is None:
        return "no data"
    return f"{round(fraction * 100)}%"


@register.filter
def bar_width(fraction):
    """Width for a usage bar; 0 when there is no data (the bar is styled as hatched then)."""
    fraction = _number(fraction)
    if fraction is None:
        return 0
    return max(0, min(100, round(fraction * 100)))


@register.filter
def gb(nbytes):
    nbytes = _number(nbytes)
    if nbytes is None:
        return "—"
    return f"{nbytes / 1e9:.0f} GB"


@register.filter
def ago(epoch_seconds):
    epoch_seconds = _number(epoch_seconds)
    if not epoch_seconds:
        return "never"
    seconds = max(0, time.time() - epoch_seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


@register.filter
def ms(seconds):
    seconds = _number(seconds)
    if seconds is None:
        return "no data"
    return f"{seconds * 1000:.0f} ms"


@register.filter
def num(value, digits=1):
    value = _number(value)
    if value is None:
        return "no data"
    return f"{value:.{int(digits)}f}"


@register.filter
def pct_short(fraction):
    """0.431 → "43%"; None → "–" (tiles have no room for "no data")."""
    fraction = _number(fraction)
    return "–" if fraction is None else f"{round(fraction * 100)}%"


@register.filter
def decile(fraction):
    """0.431 → 4 (a shade class u0…u10); None → "n" (hatched: no data)."""
    fraction = _number(fraction)
    if fraction is None:
        return "n"
    return max(0, min(10, round(fraction * 10)))


@register.filter
def status_label(status):
    from controlplane.dashboard.nodestatus import LABELS

    return LABELS.get(status, status)


@register.filter
def decision(plan):
    """The plan's decision view (controlplane.dashboard.decision), with what was measured
    on the running layout once the plan is applied."""
    from controlplane.dashboard.decision import decision_view, measured_after_apply

    return decision_view(plan, measured_after_apply(plan))
