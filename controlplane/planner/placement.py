"""Concrete placement: which workers take the prefill role for a given P:D count.

Prefill workers are spread over nodes, then over NVLink groups inside a node, in proportion
to each one's share of the model's workers. With every node and group holding the fleet's
P:D ratio, a prefill worker always finds decode workers behind its own NVLink or PCIe
switch and KV stays off the network. Within a group the workers that already hold the role
(then the idlest ones) are picked, so a new layout changes as few roles as possible.

Pure and deterministic: ties break on names.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .costmodel import Link, PathMix, best_link


@dataclass(frozen=True)
class NicInput:
    fabric: str
    line_rate_gbps: float
    rdma: bool


@dataclass(frozen=True)
class WorkerInput:
    id: int
    name: str
    node: str
    nvlink_group: int | None = None
    role: str = "both"  # prefill | decode | both: the role it has, or drains toward
    state: str = "active"  # active | draining | …
    changed_at: float | None = None  # epoch seconds of the last role change
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    stale: bool = False


@dataclass(frozen=True)
class NodeLinks:
    """What one node offers for KV transfers: PCIe between its GPUs, NVLink inside groups,
    and NICs on named fabrics to other nodes."""

    pcie: Link = field(default_factory=lambda: Link.pcie(5, 16))
    nvlink: Link | None = None
    nics: tuple[NicInput, ...] = ()


def network_path(a: NodeLinks, b: NodeLinks) -> Link | None:
    """Best path between two nodes: a fabric both have a NIC on; the slower NIC bounds it,
    and it is RDMA only if both ends are."""
    options = []
    by_fabric = defaultdict(list)
    for nic in b.nics:
        by_fabric[nic.fabric].append(nic)
    for nic in a.nics:
        for other in by_fabric.get(nic.fabric, ()):
            rate = min(nic.line_rate_gbps, other.line_rate_gbps)
            options.append(Link.nic(rate, nic.rdma and other.rdma))
    return best_link(options)


@dataclass(frozen=True)
class Placement:
    roles: dict[int, str]  # worker id → prefill | decode | both
    paths: PathMix

    def changes(self, workers: list[WorkerInput]) -> list[tuple[WorkerInput, str]]:
        return [(w, self.roles[w.id]) for w in workers if self.roles.get(w.id, w.role) != w.role]


def _hand_out(quota, sizes, order, left: int):
    """Give the ``left`` units one at a time in ``order``, round after round, to the keys
    still under their size (``quota`` is updated in place and returned)."""
    while left > 0:
        progressed = False
        for k in order:
            if left == 0:
                break
            if quota[k] < sizes[k]:
                quota[k] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return quota


def _largest_remainder(total: int, sizes: dict, prefer: dict) -> dict:
    """Split ``total`` over keys in proportion to ``sizes`` (never above a key's size);
    remainders go first to keys with the larger ``prefer`` score, then by key."""
    n = sum(sizes.values())
    if n == 0 or total <= 0:
        return dict.fromkeys(sizes, 0)
    exact = {k: total * s / n for k, s in sizes.items()}
    quota = {k: min(int(v), sizes[k]) for k, v in exact.items()}
    left = total - sum(quota.values())
    if left <= 0:
        return quota
    # Sorted on (larger remainder, larger preference, key); the position breaks what is
    # left of a tie as a stable sort would, and keeps the keys themselves out of the compare.
    get = prefer.get
    order = [k for *_r, k in sorted(
        [(-(v - int(v)), -get(k, 0), str(k), i, k) for i, (k, v) in enumerate(exact.items())]
    )]
    return _hand_out(quota, sizes, order, left)


_ROLE_RANK = {"prefill": 0, "both": 1, "decode": 2}


def _pick_order(w: WorkerInput) -> tuple:
    # Already prefill first, then aggregated, then decode; fewer sequences in flight first.
    return (_ROLE_RANK.get(w.role, 3), w.running + w.waiting, w.name, w.id)


# Path mixes by topology structure (see Topology.__init__), shared across instances.
_SHARED_PATHS: dict[tuple, dict[int, PathMix]] = {}
_SHARED_PATHS_MAX = 64


class Topology:
    """A model's workers grouped by node and NVLink group, built once per planning cycle so
    that each P:D candidate costs only a walk over the groups."""

    def __init__(self, workers: list[WorkerInput], node_links: dict[str, NodeLinks] | None):
        self.workers = list(workers)
        self.node_links = node_links or {}
        by_node: dict[str, list[WorkerInput]] = defaultdict(list)
        for w in self.workers:
            by_node[w.node].append(w)
        self.nodes = sorted(by_node)
        self.node_size = {n: len(by_node[n]) for n in self.nodes}
        self.node_prefer = {
            n: sum([1 for w in by_node[n] if w.role == "prefill"]) for n in self.nodes
        }
        # Per node: [(group key, workers in pick order)], groups in a fixed order.
        self.groups: dict[str, list[tuple, list[WorkerInput]]] = {}
        for n in self.nodes:
            groups: dict = defaultdict(list)
            for w in by_node[n]:
                groups[w.nvlink_group].append(w)
            keys = sorted(groups, key=lambda x: (x is None, x if x is not None else 0))
            self.groups[n] = [(g, sorted(groups[g], key=_pick_order)) for g in keys]
        # Per node, what the group split depends on; identical nodes share one cache entry.
        self._group_sig = {
            n: (
                tuple((g, len(ws)) for g, ws in self.groups[n]),
                tuple([sum([1 for w in ws if w.role == "prefill"]) for _g, ws in self.groups[n]]),
            )
            for n in self.nodes
        }
        self._group_cache: dict[tuple, dict] = {}
        self._node_entry: dict[tuple, tuple] = {}
        self._network: dict[tuple[int, int], Link | None] = {}
        # Small integer ids for signatures and link sets: hashing them per candidate is cheap.
        sig_ids: dict[tuple, int] = {}
        self._sig_id = {n: sig_ids.setdefault(self._group_sig[n], len(sig_ids)) for n in self.nodes}
        given = self.node_links
        self.links = {n: given[n] if n in given else NodeLinks() for n in self.nodes}
        link_ids: dict[NodeLinks, int] = {}
        self.link_id = {n: link_ids.setdefault(self.links[n], len(link_ids)) for n in self.nodes}
        self.distinct_links = list(link_ids)
        distinct = self.distinct_links
        nvlinks = [lk.nvlink for lk in distinct if lk.nvlink is not None]
        self.nvlink = min(nvlinks, key=lambda lk: lk.gbs) if nvlinks else None
        self.pcie = min((lk.pcie for lk in distinct), key=lambda lk: lk.gbs) if distinct else None
        # The node split (_node_quotas) on lists in node order: sizes, link ids, and each
        # node's place in the remainder's tie-break (larger preference, then the key).
        self._sizes = [self.node_size[n] for n in self.nodes]
        self._link_of = [self.link_id[n] for n in self.nodes]
        self._sig_of = [self._sig_id[n] for n in self.nodes]
        pref = [-self.node_prefer.get(n, 0) for n in self.nodes]
        names = [str(n) for n in self.nodes]
        tie = sorted(range(len(self.nodes)), key=lambda i: (pref[i], names[i], i))
        self._tie_rank = [0] * len(self.nodes)
        for rank, i in enumerate(tie):
            self._tie_rank[i] = rank
        # Per distinct node size, its nodes in tie-break order.
        self._by_size: dict[int, list[int]] = defaultdict(list)
        for i in tie:
            self._by_size[self._sizes[i]].append(i)
        # Everything a path mix reads, in node order: topologies alike in it (the models of
        # one fleet shape; one model from cycle to cycle) share their path mixes. Groups and
        # links by repr, which tells 1 from True and 450 from 450.0 (equal keys, but one
        # sorts apart in a tie-break, the other prints apart in a PathMix).
        structure = (len(self.workers), tuple(self._sizes), tuple(self._tie_rank),
                     tuple(self._link_of),
                     repr([self._group_sig[n] for n in self.nodes]), repr(self.distinct_links))
        shared = _SHARED_PATHS.get(structure)
        if shared is None:
            if len(_SHARED_PATHS) >= _SHARED_PATHS_MAX:
                _SHARED_PATHS.clear()
            shared = _SHARED_PATHS[structure] = {}
        self._paths = shared

    def _group_quota(self, node: str, quota: int) -> dict:
        sig, prefer = self._group_sig[node]
        key = (self._sig_id[node], quota)
        if key not in self._group_cache:
            self._group_cache[key] = _largest_remainder(
                quota, dict(sig), {g: p for (g, _), p in zip(sig, prefer, strict=True)}
            )
        return self._group_cache[key]

    def _quotas(self, n_prefill: int):
        node_quota = _largest_remainder(n_prefill, self.node_size, self.node_prefer)
        for n in self.nodes:
            g_quota = self._group_quota(n, node_quota[n])
            yield n, [(g, ws, g_quota[g]) for g, ws in self.groups[n]]

    def paths(self, n_prefill: int) -> PathMix:
        """The path mix of the placement with ``n_prefill`` prefill workers: a function of
        the topology and the count alone, so computed once per count (the search and the
        gate ask for the same counts many times)."""
        if n_prefill <= 0:
            return PathMix()
        hit = self._paths.get(n_prefill)
        if hit is None:
            hit = self._paths[n_prefill] = self._path_counts(n_prefill)
        return hit

    def _node_quotas(self, total: int) -> list[int]:
        """:func:`_largest_remainder` over the nodes (sizes, prefill preference, names), as
        a list in node order: the same split, with what depends on a node's size alone
        computed once per distinct size."""
        sizes = self._sizes
        n = len(self.workers)
        if n == 0 or total <= 0:
            return [0] * len(sizes)
        exact = {s: total * s / n for s in self._by_size}
        floor = {s: min(int(v), s) for s, v in exact.items()}
        quota = [floor[s] for s in sizes]
        left = total - sum(quota)
        if left <= 0:
            return quota
        # Larger remainder first, then the tie-break (preference, name): nodes of one size
        # share a remainder, so the order is their precomputed lists, merged where two sizes
        # have the same remainder.
        by_frac: dict[float, list[int]] = {}
        for s, v in exact.items():
            by_frac.setdefault(-(v - int(v)), []).append(s)
        order: list[int] = []
        tie = self._tie_rank
        for f in sorted(by_frac):
            group = by_frac[f]
            if len(group) == 1:
                order.extend(self._by_size[group[0]])
            else:
                order.extend(sorted([i for s in group for i in self._by_size[s]],
                                    key=tie.__getitem__))
        return _hand_out(quota, sizes, order, left)

    def _path_counts(self, n_prefill: int) -> PathMix:
        n_p, n_d = n_prefill, len(self.workers) - n_prefill
        if n_p <= 0 or n_d <= 0:
            return PathMix()
        # Per (node signature, quota) — what a node's counts depend on — its groups' share
        # terms min(p ÷ P, d ÷ D) (NVLink groups only), its own term, whether it sends or
        # receives across nodes. The sums run over the nodes in order, as before.
        keys = list(zip(self._sig_of, self._node_quotas(n_prefill), strict=True))
        # key -> its first node (written last when walking the nodes backwards)
        first = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1), strict=True))
        terms: dict[tuple[int, int], tuple] = {}
        for key, i in first.items():
            counts, p_node, d_node = self._node_counts(i, key[1])
            terms[key] = (
                [min(p / n_p, d / n_d) for p, d, has in counts if has],
                min(p_node / n_p, d_node / n_d),
                p_node / n_p > d_node / n_d + 1e-12,
                d_node / n_d > p_node / n_p + 1e-12,
            )
        entries = list(map(terms.__getitem__, keys))
        link_of = self._link_of
        src = [link_of[i] for i, e in enumerate(entries) if e[2]]
        dst = [link_of[i] for i, e in enumerate(entries) if e[3]]
        return _path_mix(sum([t for e in entries for t in e[0]]), sum([e[1] for e in entries]),
                         sorted(set(src)), sorted(set(dst)), len(src), self)

    def _node_counts(self, i: int, quota: int) -> tuple[list, int, int]:
        """(groups' (prefill, decode, NVLink) counts, node's prefill, node's decode) for node
        ``i`` holding ``quota`` prefill workers; per (node signature, quota)."""
        key = (self._sig_of[i], quota)
        entry = self._node_entry.get(key)
        if entry is None:
            n = self.nodes[i]
            g_quota = self._group_quota(n, quota)
            counts = [(g_quota[g], len(ws) - g_quota[g], g is not None)
                      for g, ws in self.groups[n]]
            p_node = 0
            for q, _d, _has in counts:
                p_node += q
            entry = self._node_entry[key] = (counts, p_node, self._sizes[i] - p_node)
        return entry

    def network_path(self, a: int, b: int) -> Link | None:
        """:func:`network_path` between two distinct link sets (by id), computed once."""
        key = (a, b)
        if key not in self._network:
            self._network[key] = network_path(self.distinct_links[a], self.distinct_links[b])
        return self._network[key]

    def placement(self, n_prefill: int) -> Placement:
        if n_prefill <= 0:
            return Placement({w.id: "both" for w in self.workers}, PathMix())
        roles: dict[int, str] = {}
        for _n, groups in self._quotas(n_prefill):
            for _g, ws, q in groups:
                for i, w in enumerate(ws):
                    roles[w.id] = "prefill" if i < q else "decode"
        return Placement(roles, self.paths(n_prefill))


def place(
    workers: list[WorkerInput],
    n_prefill: int,
    node_links: dict[str, NodeLinks] | None = None,
) -> Placement:
    """Roles for ``n_prefill`` prefill workers among ``workers`` (0 = aggregated)."""
    return Topology(workers, node_links).placement(n_prefill)


def _path_mix(nv: float, local: float, src_links: list[int], dst_links: list[int],
              senders: int, topo: Topology) -> PathMix:
    """Shares of transfers per link kind when each prefill worker's output is spread over
    decode workers in proportion to their count, nearest first: ``nv`` and ``local`` are
    the sums over NVLink groups and nodes of min(prefill share, decode share); the links
    are those of the nodes sending (more prefill than decode share) and receiving."""
    net = max(0.0, 1.0 - local)
    pcie = max(0.0, local - nv)
    nvlink = topo.nvlink
    network = None
    if net > 1e-9:
        senders = max(senders, 1)
        worst = None
        # Distinct link sets only: a thousand identical nodes are one pair to check.
        for a in src_links:
            for b in dst_links:
                lk = topo.network_path(a, b)
                if lk is None:
                    lk = Link("tcp", 0.0, "no shared fabric")
                if worst is None or lk.gbs < worst.gbs or (
                    lk.gbs == worst.gbs and lk.kind == "tcp"
                ):
                    worst = lk
        network = worst
    else:
        senders = 1
    return PathMix(
        nvlink=nv if nvlink else 0.0,
        pcie=pcie + (0.0 if nvlink else nv),
        network=net,
        nvlink_link=nvlink,
        pcie_link=topo.pcie,
        network_link=network,
        network_nodes=senders,
    )
