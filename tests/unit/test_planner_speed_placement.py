"""The placement's fast paths give what the plain definitions give (issue 17, planning-cycle
speed): the node split per prefill count equals :func:`_largest_remainder` over the nodes,
and the cached path mix equals one computed from the roles of a fresh placement."""

from __future__ import annotations

import random

import pytest

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
