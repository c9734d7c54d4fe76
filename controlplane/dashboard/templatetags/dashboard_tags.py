import time

from django import template

register = template.Library()


@register.filter
def pct(fraction):
    """0.431 → "43%"; None → "no data"."""
    if fraction is None:
        return "no data"
    return f"{round(fraction * 100)}%"


@register.filter
def bar_width(fraction):
    """Width for a usage bar; 0 when there is no data (the bar is styled as hatched then)."""
    if fraction is None:
        return 0
    return max(0, min(100, round(fraction * 100)))


@register.filter
def gb(nbytes):
    if nbytes is None:
        return "—"
    return f"{nbytes / 1e9:.0f} GB"


@register.filter
def ago(epoch_seconds):
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
    if seconds is None:
        return "no data"
    return f"{seconds * 1000:.0f} ms"


@register.filter
def num(value, digits=1):
    if value is None:
        return "no data"
    return f"{value:.{int(digits)}f}"
