"""Dashboard pages. Data gathering lives in viewmodels.py; these stay thin."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string

from controlplane.accounts.roles import READ, restrict
from controlplane.topology.models import Node

from .viewmodels import NODE_FIELDS, Filters, node_cards, topology, visible_nodes


def _query(filters: Filters) -> str:
    return urlencode({k: v for k, v in vars(filters).items() if v})


@login_required
def topology_view(request):
    filters = Filters.from_query(request.GET)
    query = _query(filters)
    context = {
        "filters": filters,
        "topo": topology(request.user, filters),
        "ws_url": "/ws/live/" + (f"?{query}" if query else ""),
        "poll_url": "/live/poll" + (f"?{query}" if query else ""),
    }
    return render(request, "dashboard/topology.html", context)


def render_node_fragments(user, filters: Filters, node_ids=None) -> str:
    """Out-of-band fragments for nodes in the viewer's filter (all, or only ``node_ids``)."""
    nodes = visible_nodes(user, filters)
    if node_ids is not None:
        nodes = nodes.filter(id__in=node_ids)
    cards = node_cards(list(nodes.values(*NODE_FIELDS)), filters)
    return "".join(
        render_to_string("dashboard/_node_card.html", {"card": card, "oob": True})
        for card in cards
    )


@login_required
def live_poll_view(request):
    """Polling fallback when websockets are unavailable: the same OOB fragments."""
    filters = Filters.from_query(request.GET)
    return HttpResponse(render_node_fragments(request.user, filters))


@login_required
def node_view(request, pk: int):
    node = get_object_or_404(restrict(Node.objects.select_related("cluster"), request.user, READ),
                             pk=pk)
    from .nodepage import node_context

    return render(request, "dashboard/node.html", node_context(request, node))
