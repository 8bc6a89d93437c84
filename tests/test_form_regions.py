"""form_regions on random DAGs: every region convex (checked by brute force over paths), every
fusable node in exactly one region, each region in topological order, and the regions the
same as a plain sweep of the same rule (bitsets rebuilt at every node, no sharing); regions_of
sweeping several sets at once gives each set's own regions."""

from __future__ import annotations

import random

import pytest

from graphkernel import Graph, TensorType
from graphkernel.fusion import form_regions, regions_of


def random_dag(seed: int, size: int) -> tuple[Graph, set[int]]:
    """Unary and binary nodes reading random earlier values (sometimes one value twice);
    a random half of them fusable."""
    rng = random.Random(seed)
    g = Graph(f"dag{seed}")
    values = [g.add_input(f"x{i}", TensorType((4,), "float32")) for i in range(2)]
    for i in range(size):
        recent = values[-6:] if rng.random() < 0.7 else values  # mostly local, some long edges
        if rng.random() < 0.4:
            v = g.add_node("Neg", [rng.choice(recent)], name=f"n{i}").output
        else:
            a = rng.choice(recent)
            b = a if rng.random() < 0.15 else rng.choice(values)
            v = g.add_node("Add", [a, b], name=f"n{i}").output
        values.append(v)
    g.set_outputs([v for v in values if v.producer is not None and not v.uses] or values[-1:])
    fusable = {id(n) for n in g.nodes if rng.random() < 0.6}
    return g, fusable


def descendants(g: Graph) -> dict[int, set[int]]:
    """id(node) -> ids of every node reachable from it (itself excluded)."""
    out: dict[int, set[int]] = {}
    for n in reversed(g.nodes):
        s: set[int] = set()
        for u in n.users:
            s.add(id(u))
            s |= out[id(u)]
        out[id(n)] = s
    return out


def plain_regions(g: Graph, fusable: set[int]) -> list[list[str]]:
    """The rule of form_regions swept plainly: each node's region id set and leaving set
    built anew from its producers', never freed."""
    parent: list[int] = []
    members: list[int] = []
    region_left: list[int] = []
    region_of: dict[int, int] = {}
    anc: dict[int, int] = {}
    left: dict[int, int] = {}

    def find(r: int) -> int:
        while parent[r] != r:
            r = parent[r]
        return r

    for n in g.nodes:
        preds = list(dict.fromkeys(v.producer for v in n.inputs if v.producer is not None))
        a_in = l_in = 0
        for p in preds:
            a_in |= anc[id(p)]
            l_in |= left[id(p)]
        if id(n) not in fusable:
            anc[id(n)], left[id(n)] = a_in, l_in | a_in
            continue
        chosen = -1
        for p in preds:
            if id(p) not in region_of:
                continue
            r = find(region_of[id(p)])
            if r == chosen or members[r] & l_in:
                continue
            if chosen < 0:
                chosen = r
            elif not members[r] & region_left[chosen] and not members[chosen] & region_left[r]:
                parent[r] = chosen
                members[chosen] |= members[r]
                region_left[chosen] |= region_left[r]
        if chosen < 0:
            chosen = len(parent)
            parent.append(chosen)
            members.append(1 << chosen)
            region_left.append(0)
        region_of[id(n)] = chosen
        anc[id(n)] = a_in | (1 << chosen)
        left[id(n)] = l_in | (a_in & ~members[chosen])
        region_left[chosen] |= left[id(n)]
    groups: dict[int, list[str]] = {}
    for n in g.nodes:
        if id(n) in region_of:
            groups.setdefault(find(region_of[id(n)]), []).append(n.name)
    return list(groups.values())


@pytest.mark.parametrize("seed", range(40))
def test_regions_are_convex_and_match_the_plain_sweep(seed):
    g, fusable = random_dag(seed, 30 + seed % 5 * 20)
    regions = form_regions(g, fusable)
    order = {id(n): i for i, n in enumerate(g.nodes)}
    names = [[n.name for n in r] for r in regions]
    assert names == plain_regions(g, fusable)
    placed = [id(n) for r in regions for n in r]
    assert sorted(placed) == sorted(fusable)  # each fusable node in exactly one region
    desc = descendants(g)
    for r in regions:
        assert [order[id(n)] for n in r] == sorted(order[id(n)] for n in r)
        ids = {id(n) for n in r}
        for a in r:
            for b in r:
                # convex: no node outside the region lies on a path from a to b
                between = {x for x in desc[id(a)] if id(b) in desc[x]}
                assert between <= ids, (seed, a.name, b.name)


def test_a_long_chain_is_one_region_and_a_detour_splits_it():
    g = Graph("chain")
    v = g.add_input("x", TensorType((4,), "float32"))
    for i in range(2000):  # deep enough to catch recursion or quadratic bitsets
        v = g.add_node("Neg", [v], name=f"c{i}").output
    skip = g.add_node("Neg", [v], name="out_of_region").output
    g.set_outputs([g.add_node("Add", [v, skip], name="join").output])
    fusable = {id(n) for n in g.nodes if n.name != "out_of_region"}
    regions = form_regions(g, fusable)
    assert [len(r) for r in regions] == [2000, 1]  # join reads c1999 through the detour too
    assert regions[1][0].name == "join"


@pytest.mark.parametrize("seed", range(10))
def test_one_sweep_of_several_sets_gives_each_sets_regions(seed):
    g, fusable = random_dag(seed, 60)
    rng = random.Random(seed)
    fewer = {i for i in fusable if rng.random() < 0.7}
    other = {id(n) for n in g.nodes if rng.random() < 0.5}
    for sets in ([fusable, fewer, other], [other, fusable], [set(), fusable]):
        names = [[[n.name for n in r] for r in regions] for regions in regions_of(g, sets)]
        assert names == [plain_regions(g, s) for s in sets]


@pytest.mark.parametrize("seed", range(10))
def test_renumbering_the_bit_slots_changes_no_region(seed, monkeypatch):
    """Slots renumbered after (nearly) every new region: the regions stay the plain sweep's."""
    from graphkernel import fusion

    renumbered = []
    renumber = fusion._renumber
    monkeypatch.setattr(fusion, "RENUMBER_AT", 1)
    monkeypatch.setattr(fusion, "_renumber", lambda sweep: renumbered.append(1) or
                        renumber(sweep))
    g, fusable = random_dag(100 + seed, 200)
    rng = random.Random(seed)
    fewer = {id(n) for n in g.nodes if id(n) in fusable and rng.random() < 0.6}
    names = [[[n.name for n in r] for r in regions] for regions in
             fusion.regions_of(g, [fusable, fewer])]
    assert names == [plain_regions(g, fusable), plain_regions(g, fewer)]
    assert len(renumbered) >= 5
