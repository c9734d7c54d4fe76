"""The placement's fast paths give what the plain definitions give (issue 17, planning-cycle
speed): the node split per prefill count equals :func:`_largest_remainder` over the nodes,
and the cached path mix equals one computed from the roles of a fresh placement."""

from __future__ import annotations

import random

import pytest

from controlplane.planner import placement
from controlplane.planner.costmodel import Link
from controlplane.planner.placement import (
    NicInput,
    NodeLinks,
    Topology,
    WorkerInput,
    _largest_remainder,
)


def _topology(seed: int) -> Topology:
    r = random.Random(seed)
    workers, links = [], {}
    wid = 0
    for _ in range(r.randint(1, 12)):
        node = f"n{r.randint(0, 40):02d}"
        for _g in range(r.choice([1, 2, 4, 8, r.randint(1, 9)])):
            workers.append(WorkerInput(wid, f"{node}/w{wid}", node, r.choice([None, 0, 1]),
                                       role=r.choice(["both", "prefill", "decode"])))
            wid += 1
        links[node] = NodeLinks(Link.pcie(5, 16), r.choice([None, Link.nvlink(450)]),
                                r.choice([(), (NicInput("ib", 400, True),),
                                          (NicInput("eth", 100, False),)]))
    return Topology(workers, links)


@pytest.mark.parametrize("seed", range(60))
def test_node_quotas_are_the_largest_remainder_split(seed):
    topo = _topology(seed)
    for total in range(-1, len(topo.workers) + 3):
        want = _largest_remainder(total, topo.node_size, topo.node_prefer)
        assert topo._node_quotas(total) == [want[n] for n in topo.nodes]


@pytest.mark.parametrize("seed", range(20))
def test_paths_are_the_same_asked_in_any_order(seed):
    topo = _topology(seed)
    counts = list(range(0, len(topo.workers) + 2))
    first = {p: repr(topo.paths(p)) for p in counts}
    random.Random(seed).shuffle(counts)
    fresh = _topology(seed)
    assert {p: repr(fresh.paths(p)) for p in counts} == first
    assert {p: repr(topo.paths(p)) for p in counts} == first


def _fresh_paths(topo: Topology) -> dict[int, str]:
    """Every count's path mix computed by this topology alone (the shared store emptied)."""
    placement._SHARED_PATHS.clear()
    alone = Topology(topo.workers, topo.node_links)
    return {p: repr(alone.paths(p)) for p in range(len(topo.workers) + 2)}


def _twins(seed: int) -> list[Topology]:
    """Topologies alike in shape that differ in what a shared path mix must not blur: node
    names that sort the tie-break apart, 450 vs 450.0 GB/s links, group key 1 vs True."""
    r = random.Random(seed)
    out = []
    for names, gbs, group in (("ab", 450, 1), ("ba", 450, 1), ("ab", 450.0, 1),
                              ("ab", 450, True), ("ab", 450, 1)):
        workers, links = [], {}
        wid = 0
        for k, size in enumerate((3, 5, 3)):
            node = f"{names[k % 2]}{k}"
            for _ in range(size):
                workers.append(WorkerInput(wid, f"{node}/w{wid}", node,
                                           group if r.random() < 0.5 else 0,
                                           role=r.choice(["both", "prefill"])))
                wid += 1
            links[node] = NodeLinks(Link.pcie(5, 16), Link("nvlink", gbs, "x"),
                                    (NicInput("ib", 400, True),))
        out.append(Topology(workers, links))
        r = random.Random(seed)  # the same roles and groups for every twin
    return out


@pytest.mark.parametrize("seed", range(12))
def test_shared_path_mixes_are_each_topologys_own(seed):
    placement._SHARED_PATHS.clear()
    topos = [*_twins(seed), _topology(seed), _topology(seed + 100)]
    shared = [{p: repr(t.paths(p)) for p in range(len(t.workers) + 2)} for t in topos]
    for topo, got in zip(topos, shared, strict=True):
        assert got == _fresh_paths(topo)
