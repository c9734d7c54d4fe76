"""Dashboard pages. Data gathering lives in viewmodels.py; these stay thin."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string

from controlplane.accounts.access import restrict
from controlplane.accounts.roles import READ
from controlplane.topology.models import Node

from .viewmodels import (
    NODE_FIELDS,
    Filters,
    node_cards,
    summary_mode,
    topology,
    visible_nodes,
)


def _query(filters: Filters) -> str:
    return urlencode({k: v for k, v in vars(filters).items() if v})


@login_required
def topology_view(request):
    filters = Filters.from_query(request.GET)
    query = _query(filters)
    rack_query = f"{query}&" if query else ""
    if request.GET.get("rpage", "").isdigit():  # the live view follows the rack page
        query = "&".join(x for x in (query, f"rpage={request.GET['rpage']}") if x)
    context = {
        "filters": filters,
        "topo": topology(request.user, filters, request.GET.get("rpage")),
        "rack_query": rack_query,
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


def render_rack_fragments(user, filters: Filters, node_ids=None, rack_page_number=None) -> str:
    """Out-of-band rack tiles (the big-fleet view) of the racks on the viewer's page: all of
    them, or those holding ``node_ids``."""
    from .racks import nodes_in_racks, rack_page, rack_summaries

    nodes = visible_nodes(user, filters)
    pairs, _ = rack_page(nodes, rack_page_number)
    if node_ids is not None:
        hinted = set(nodes.filter(id__in=node_ids).values_list("cluster_id", "rack"))
        pairs = [p for p in pairs if p in hinted]
        if not pairs:
            return ""
    nodes = nodes_in_racks(nodes, pairs)
    rows = list(nodes.order_by("cluster__name", "rack", "hostname").values(*NODE_FIELDS))
    return "".join(
        render_to_string("dashboard/_rack_tile.html", {"rack": rack, "oob": True})
        for rack in rack_summaries(rows, nodes)
    )


@login_required
def live_poll_view(request):
    """Polling fallback when websockets are unavailable: the same OOB fragments."""
    from django.middleware.csrf import get_token

    from .liveregions import PAGES, render_regions

    page = request.GET.get("page", "topology")
    if page in PAGES:
        query = {k: v[:128] for k, v in request.GET.items()}
        regions = render_regions(page, request.user, query, get_token(request))
        return HttpResponse("".join(regions.values()))
    filters = Filters.from_query(request.GET)
    if summary_mode(visible_nodes(request.user, filters), filters):
        return HttpResponse(render_rack_fragments(request.user, filters,
                                                  rack_page_number=request.GET.get("rpage")))
    return HttpResponse(render_node_fragments(request.user, filters))


@login_required
def node_view(request, pk: int):
    node = get_object_or_404(restrict(Node.objects.select_related("cluster"), request.user, READ),
                             pk=pk)
    from .liveregions import live_urls
    from .nodepage import node_context

    context = {**node_context(request.user, node), **live_urls("node", {"node": str(node.pk)})}
    return render(request, "dashboard/node.html", context)
