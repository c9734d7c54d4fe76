"""Live dashboard over websockets: out-of-band HTML fragments for htmx's ws extension.

One consumer serves every live page (``?page=`` topology — the default —, models, plans,
routing, alerts, node). The ingest fans out "these nodes changed" hints per cluster at most
about once a second; plan, routing-table and alert saves send a "page changed" hint
(controlplane.dashboard.signals). Each connection coalesces what it was told and, at most
once per ``FLUSH_INTERVAL_S``, re-renders only that:

- topology: the hinted node cards — or, for a big fleet shown as rack tiles, the hinted
  nodes' rack tiles;
- other pages: their regions (controlplane.dashboard.liveregions), sending only those
  whose HTML changed, and looking again at least every ``REFRESH_S`` (so a change nobody
  hinted still shows within seconds).

Hints are lossy by design (channel layers drop when full), so every (re)connect starts with
a full snapshot of what the viewer is looking at. When there is nothing new, a small status
fragment still goes out every ``REFRESH_S``; the page shows "updated N s ago" from the
last message it received.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from .liveregions import PAGES, REFRESH_S, csrf_for_scope, digest, render_regions
from .viewmodels import Filters

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
GLOBAL_GROUP = "live.all"  # hints with no cluster (alerts)


def status_fragment() -> str:
    return (f'<span id="live-status" class="live-status on" hx-swap-oob="true" '
            f'data-ts="{time.time():.0f}">live</span>')


def cluster_group(cluster_id: int) -> str:
    return f"live.cluster.{cluster_id}"


class LiveTopologyConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        raw_query = self.scope.get("query_string", b"").decode()
        self.query = {k: v[-1][:128] for k, v in parse_qs(raw_query).items()}
        self.page = self.query.get("page", "topology")
        if self.page not in PAGES:
            self.page = "topology"
        self.filters = Filters.from_query(self.query)
        self.only_node = (int(self.query["node"]) if self.query.get("node", "").isdigit()
                          else None)
        self.user = user
        self.csrf_token = csrf_for_scope(self.scope)
        self.pending: set[int] = set()
        self.dirty = False
        self.sent: dict[str, bytes] = {}
        self.last_send = 0.0
        self.groups_joined = [*await self._visible_cluster_groups(), GLOBAL_GROUP]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.fragments_sent = 0
        self.summary = False
        if self.page == "topology":
            self.summary = await database_sync_to_async(self._summary_mode)()
            await self._send_fragments(None)
        else:
            await self._send_regions()
        self.flusher = asyncio.create_task(self._flush_loop())

    async def disconnect(self, code):
        flusher = getattr(self, "flusher", None)
        if flusher:
            flusher.cancel()
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        # The page sends nothing we act on; ignore rather than error.
        return

    async def telemetry_changed(self, event):
        ids = event.get("node_ids") or []
        self.pending.update(int(i) for i in ids if isinstance(i, int | str) and str(i).isdigit())
        self.dirty = True

    async def topology_changed(self, event):
        """Structural change (role flip, drain): treat like a telemetry hint."""
        await self.telemetry_changed(event)

    async def page_changed(self, event):
        """A plan, routing table or alert changed: region pages look again."""
        self.dirty = True

    async def _flush_loop(self):
        try:
            while True:
                await asyncio.sleep(FLUSH_INTERVAL_S)
                due = time.monotonic() - self.last_send >= REFRESH_S
                if self.page != "topology":
                    if self.dirty or due:
                        self.dirty = False
                        await self._send_regions()
                    continue
                if not self.pending:
                    if due:
                        await self._send(status_fragment())
                    continue
                ids, self.pending = self.pending, set()
                if self.only_node is not None:
                    ids &= {self.only_node}
                    if not ids:
                        continue
                await self._send_fragments(sorted(ids))
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("live flush loop failed; the browser will reconnect")
            await self.close(code=1011)

    async def _send(self, html: str) -> None:
        await self.send(text_data=html)
        self.last_send = time.monotonic()

    async def _send_regions(self):
        regions = await database_sync_to_async(render_regions)(
            self.page, self.user, self.query, self.csrf_token)
        first = not self.sent
        changed = []
        for rid, html in regions.items():
            d = digest(html)
            if self.sent.get(rid) != d:
                self.sent[rid] = d
                changed.append(html)
        if changed or first or time.monotonic() - self.last_send >= REFRESH_S:
            await self._send((status_fragment() if first or not changed else "")
                             + "".join(changed))
            self.fragments_sent += len(changed)

    async def _send_fragments(self, node_ids):
        if node_ids is None and self.only_node is not None:
            node_ids = [self.only_node]
        html = await database_sync_to_async(self._render)(node_ids)
        if node_ids is None:
            html = status_fragment() + html
        if html:
            await self._send(html)
            self.fragments_sent += html.count('hx-swap-oob="true"')

    def _summary_mode(self) -> bool:
        from .viewmodels import summary_mode, visible_nodes

        return summary_mode(visible_nodes(self.user, self.filters), self.filters)

    def _render(self, node_ids):
        from .views import render_node_fragments, render_rack_fragments

        if self.summary:
            return render_rack_fragments(self.user, self.filters, node_ids,
                                         self.query.get("rpage"))
        return render_node_fragments(self.user, self.filters, node_ids)

    @database_sync_to_async
    def _visible_cluster_groups(self) -> list[str]:
        from controlplane.accounts.access import restrict
        from controlplane.accounts.roles import READ
        from controlplane.topology.models import Cluster

        clusters = restrict(Cluster.objects.all(), self.user, READ)
        if self.filters.cluster:
            clusters = clusters.filter(name=self.filters.cluster)
        return [cluster_group(pk) for pk in clusters.values_list("pk", flat=True)]
