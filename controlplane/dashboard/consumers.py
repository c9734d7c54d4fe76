"""Live topology over websockets: out-of-band HTML fragments for htmx's ws extension.

The ingest fans out "these nodes changed" hints per cluster at most about once a second.
Each browser connection collects the hinted node ids and, at most once per second,
re-renders just those node cards (from templates, autoescaped) and sends them as
``hx-swap-oob`` fragments. Hints are lossy by design (channel layers drop when full), so
every (re)connect starts with a full snapshot of what the viewer is looking at.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from .viewmodels import Filters

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
STATUS_LIVE = '<span id="live-status" class="live-status on" hx-swap-oob="true">live</span>'


def cluster_group(cluster_id: int) -> str:
    return f"live.cluster.{cluster_id}"


class LiveTopologyConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        raw_query = self.scope.get("query_string", b"").decode()
        query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
        self.filters = Filters.from_query(query)
        self.only_node = int(query["node"]) if query.get("node", "").isdigit() else None
        self.user = user
        self.pending: set[int] = set()
        self.groups_joined = await self._visible_cluster_groups()
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.fragments_sent = 0
        await self._send_fragments(None)
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

    async def topology_changed(self, event):
        """Structural change (role flip, drain): treat like a telemetry hint."""
        await self.telemetry_changed(event)

    async def _flush_loop(self):
        try:
            while True:
                await asyncio.sleep(FLUSH_INTERVAL_S)
                if not self.pending:
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

    async def _send_fragments(self, node_ids):
        if node_ids is None and self.only_node is not None:
            node_ids = [self.only_node]
        html = await database_sync_to_async(self._render)(node_ids)
        if node_ids is None:
            html = STATUS_LIVE + html
        if html:
            await self.send(text_data=html)
            self.fragments_sent += html.count('hx-swap-oob="true"')

    def _render(self, node_ids):
        from .views import render_node_fragments

        return render_node_fragments(self.user, self.filters, node_ids)

    @database_sync_to_async
    def _visible_cluster_groups(self) -> list[str]:
        from controlplane.accounts.roles import READ, restrict
        from controlplane.topology.models import Cluster

        clusters = restrict(Cluster.objects.all(), self.user, READ)
        if self.filters.cluster:
            clusters = clusters.filter(name=self.filters.cluster)
        return [cluster_group(pk) for pk in clusters.values_list("pk", flat=True)]
