"""Graph mutation API, invariants and validation messages."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.errors import GraphError, OpError, ShapeError
from graphkernel.interpreter import run_graph
from graphkernel.ir import DType

F32 = TensorType((2, 3), "float32")


def chain():
    g = Graph("chain")
    x = g.add_input("x", F32)
    a = g.add_node("Exp", [x], name="a").output
    b = g.add_node("Neg", [a], name="b").output
    c = g.add_node("Add", [a, b], name="c").output
    g.set_outputs([c])
    return g


def test_use_lists_follow_mutation():
    g = chain()
    a, b = g.value("a"), g.value("b")
    assert [n.name for n in a.users] == ["b", "c"]
    t = g.add_node("Abs", [g.inputs[0]], name="t").output
    assert g.replace_all_uses(a, t) == 2
    assert not a.uses and {n.name for n in t.users} == {"b", "c"}
    assert g.remove_dead() == 1 and not g.has_node("a")
    g.validate()
    assert b.producer.inputs[0] is t


def test_replace_all_uses_updates_graph_outputs():
    g = chain()
    new = g.add_node("Abs", [g.inputs[0]]).output
    assert g.replace_all_uses(g.value("c"), new) == 1
    assert g.outputs == [new]


def test_erase_refuses_a_node_with_users():
    g = chain()
    with pytest.raises(GraphError, match="still used by b, c; call replace_all_uses first"):
        g.erase_node(g.node("a"))
    with pytest.raises(GraphError, match="graph output"):
        g.erase_node(g.node("c"))


def test_rewiring_to_a_later_producer_resorts_topologically():
    g = chain()
    late = g.add_node("Sqrt", [g.inputs[0]], name="late").output
    g.replace_input(g.node("b"), 0, late)
    names = [n.name for n in g.nodes]
    assert names.index("late") < names.index("b")
    g.validate()


def test_toposort_keeps_a_valid_order_and_still_finds_a_cycle_made_behind_its_back():
    g = chain()
    late = g.add_node("Sqrt", [g.inputs[0]], name="late").output
    g.replace_input(g.node("b"), 0, late)  # b now reads a later node: re-sorted
    g.add_node("Abs", [g.value("c")], name="d")
    order = [n.name for n in g.nodes]
    assert order == ["a", "late", "b", "c", "d"]
    g.toposort()
    assert [n.name for n in g.nodes] == order
    # a use-list kept consistent by hand, bypassing replace_input (and its order flag)
    a, c = g.node("a"), g.value("c")
    a.inputs[0].uses.remove((a, 0))
    a.inputs[0] = c
    c.uses.append((a, 0))
    with pytest.raises(GraphError, match="cycle"):
        g.validate()


def earliest_ready_order(g: Graph) -> list[str]:
    """The order toposort promises, by its definition: repeatedly, of the nodes whose
    producers are all placed, the one earliest in the current order."""
    position = {id(n): i for i, n in enumerate(g._nodes.values())}
    placed: set[int] = set()
    left = list(g._nodes.values())
    order = []
    while left:
        n = min((m for m in left if all(v.producer is None or id(v.producer) in placed
                                         for v in m.inputs)), key=lambda m: position[id(m)])
        placed.add(id(n))
        left.remove(n)
        order.append(n.name)
    return order


@pytest.mark.parametrize("seed", range(20))
def test_toposort_places_the_earliest_ready_node_first_after_random_rewiring(seed):
    rng = np.random.default_rng(seed)
    g = Graph("random")
    values = [g.add_input("x", F32), g.add_input("y", F32)]
    for i in range(40):
        if rng.random() < 0.5:
            ins = [values[rng.integers(len(values))]]
            op = "Exp"
        else:
            ins = [values[rng.integers(len(values))], values[rng.integers(len(values))]]
            op = "Add"
        values.append(g.add_node(op, ins, name=f"n{i}").output)
    g.set_outputs(values[-3:])
    nodes = list(g._nodes.values())
    for _ in range(15):  # rewire an input to a later node, when that makes no cycle
        a, b = sorted(rng.choice(len(nodes), 2, replace=False))
        reader, late = nodes[a], nodes[b]
        reached, todo = set(), [late]  # the nodes late reads, transitively
        while todo:
            n = todo.pop()
            for v in n.inputs:
                if v.producer is not None and id(v.producer) not in reached:
                    reached.add(id(v.producer))
                    todo.append(v.producer)
        if id(reader) not in reached:
            g.replace_input(reader, int(rng.integers(len(reader.inputs))), late.output)
    want = earliest_ready_order(g)
    g.toposort()
    assert [n.name for n in g._nodes.values()] == want
    seqs = [n._seq for n in g._nodes.values()]
    assert seqs == sorted(seqs)
    g.validate()


def test_in_order_sorts_only_the_nodes_given_and_resorts_when_they_were_rewired():
    g = chain()
    late = g.add_node("Sqrt", [g.inputs[0]], name="late").output
    g.replace_input(g.node("b"), 0, late)  # the graph's order needs mending, not a's and c's
    assert [n.name for n in g.in_order([g.node("c"), g.node("a")])] == ["a", "c"]
    assert [n.name for n in g.in_order([g.node("b"), late.producer])] == ["late", "b"]
    assert [n.name for n in g.nodes] == ["a", "late", "b", "c"]


def test_erased_nodes_are_freed_once_released_without_the_cyclic_collector():
    import gc

    from graphkernel.ir import Node

    def dead_nodes() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is Node and o.name == "dead")

    g = chain()
    gc.collect()
    gc.disable()
    try:
        out = g.add_node("Abs", [g.inputs[0]], name="dead").output
        g.erase_node(out.producer)
        del out
        assert dead_nodes() == 1  # erased, still held by its output: as it was in the pass
        g.release_erased()
        assert dead_nodes() == 0
    finally:
        gc.enable()


def test_recording_lists_the_nodes_added_inside_the_block_only():
    g = chain()
    g.add_node("Abs", [g.inputs[0]], name="before")
    with g.recording() as added:
        n1 = g.add_node("Exp", [g.value("c")], name="n1")
        with g.recording() as inner:
            n2 = g.add_node("Neg", [n1.output], name="n2")
        n3 = g.clone_node(n2, {id(n1.output): n1.output}, rename=lambda s: s + "_copy")
    g.add_node("Abs", [g.inputs[0]], name="after")
    assert added == [n1, n2, n3] and inner == [n2]
    assert not g._recorders


def test_cycle_is_reported_with_its_path():
    g = chain()
    g.replace_input(g.node("a"), 0, g.value("b"))
    with pytest.raises(GraphError, match="cycle: .*a -> b -> a|cycle: .*b -> a -> b"):
        g.validate()


def test_validate_catches_broken_use_lists():
    g = chain()
    g.value("a").uses.clear()
    with pytest.raises(GraphError, match="use-list of '%a' misses input 0"):
        g.validate()


def test_validate_catches_stale_types():
    g = chain()
    g.value("b").type = TensorType((2, 3), "float16")
    with pytest.raises(GraphError, match="do not match inferred"):
        g.validate()


def test_inputs_from_another_graph_are_rejected():
    g, h = chain(), chain()
    with pytest.raises(GraphError, match="belongs to another graph"):
        g.add_node("Exp", [h.value("a")])


def test_unknown_op_and_bad_attrs_suggest_fixes():
    g = chain()
    with pytest.raises(OpError, match="did you mean 'ReduceSum'"):
        g.add_node("ReduceSun", [g.inputs[0]])
    with pytest.raises(OpError, match="unknown attribute; did you mean 'keep_dims'"):
        g.add_node("ReduceSum", [g.inputs[0]], {"keepdims": True})
    with pytest.raises(OpError, match="takes 2 inputs, got 1"):
        g.add_node("Add", [g.inputs[0]])
    with pytest.raises(ShapeError, match="node 'bad' \\(Transpose\\)"):
        g.add_node("Transpose", [g.inputs[0]], {"perm": [0, 0]}, name="bad")


def test_duplicate_names_are_rejected():
    g = chain()
    with pytest.raises(GraphError, match="already exists"):
        g.add_node("Exp", [g.inputs[0]], name="a")
    with pytest.raises(GraphError, match="already exists"):
        g.add_input("x", F32)


def test_copy_is_deep_and_equal():
    g = chain()
    h = g.copy()
    assert str(g) == str(h)
    h.replace_all_uses(h.value("b"), h.value("a"))
    assert str(g) != str(h)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(run_graph(g, [x])[0], np.e - np.e)


def test_graph_kernel_node_runs_its_subgraph():
    sub = Graph("fused_exp_neg")
    x = sub.add_input("p0", F32)
    sub.set_outputs([sub.add_node("Neg", [sub.add_node("Exp", [x]).output]).output])
    g = Graph("outer")
    a = g.add_input("a", F32)
    k = g.add_node("GraphKernel", [a], {"subgraph": sub, "pattern": "elemwise"},
                   origin=["exp", "neg"])
    g.set_outputs([k.output])
    g.validate()
    arr = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(run_graph(g, [arr])[0], -np.exp(arr), rtol=1e-6)
    assert "origin=[exp, neg]" in str(g)


def test_dtype_parsing_and_aliases():
    assert DType.parse("fp16") is DType.float16
    assert DType.parse(np.dtype("int64")) is DType.int64
    with pytest.raises(ShapeError, match="did you mean 'float32'"):
        DType.parse("flaot32")


def test_text_form_lists_one_line_per_node():
    text = str(chain())
    assert "a: %a: float32[2,3] = Exp(%x)" in text
    assert text.count("\n") == 5


class CountingList(list):
    """A list that counts the elements read by iterating over it."""

    reads = 0

    def __iter__(self):
        for x in super().__iter__():
            CountingList.reads += 1
            yield x


def test_erasing_and_replacing_outputs_does_not_scan_every_output():
    """A training graph has an output per parameter: rewriting each of P outputs (replace,
    erase, dead-node removal) must not read all P outputs each time (P * P reads)."""
    P = 2000
    g = Graph("many_outputs")
    outs = []
    for i in range(P):
        w = g.add_input(f"w{i}", F32, mutable=True)
        outs.append(g.add_node("Exp", [w], name=f"e{i}").output)
    g.set_outputs(outs)
    g.outputs = CountingList(g.outputs)
    CountingList.reads = 0
    for i, old in enumerate(outs):
        new = g.add_node("Neg", [old.producer.inputs[0]], name=f"n{i}").output
        assert g.replace_all_uses(old, new) == 1
        g.erase_node(old.producer)
        scratch = g.add_node("Abs", [new], name=f"a{i}")  # an unused node, erased
        g.erase_node(scratch)
    g.add_node("Sqrt", [g.inputs[0]], name="unused")
    assert g.remove_dead() == 1
    assert CountingList.reads < 4 * P
    assert [v.name for v in g.outputs] == [f"e{i}" for i in range(P)]  # names kept
    assert all(v.producer.op == "Neg" for v in g.outputs)
    with pytest.raises(GraphError, match="graph output"):
        g.erase_node(g.outputs[7].producer)
    g.validate()


def test_a_value_that_is_several_outputs_is_replaced_at_each_one():
    g = chain()
    c = g.value("c")
    g.set_outputs([c, g.value("b"), c], names=["first", "b", "second"])
    new = g.add_node("Abs", [g.inputs[0]], name="abs").output
    assert g.replace_all_uses(c, new) == 2
    assert g.outputs == [new, g.value("b"), new] and g.is_output(new) and not g.is_output(c)
    g.erase_node(c.producer)
    assert g.named_outputs() == [("first", new), ("b", g.value("b")), ("second", new)]


def test_validating_a_value_of_many_users_does_not_scan_its_uses_per_user():
    class ScannedUses(list):
        scanned = 0

        def __contains__(self, item):
            ScannedUses.scanned += len(self)
            return super().__contains__(item)

    g = Graph("fanout")
    x = g.add_input("x", F32)
    for _ in range(3000):
        g.add_node("Exp", [x])
    x.uses = ScannedUses(x.uses)
    g.validate()
    assert ScannedUses.scanned < 3 * 3000
    x.uses.pop()
    with pytest.raises(GraphError, match="misses input 0"):
        g.validate()


def test_validate_catches_outputs_changed_behind_the_graphs_back():
    g = chain()
    g.outputs.append(g.value("a"))
    with pytest.raises(GraphError, match="outputs were changed in place; set them with "
                                         "set_outputs"):
        g.validate()
    g.set_outputs(g.outputs[:1] + [g.value("a")])
    g.validate()
    assert g.is_output(g.value("a"))


def test_recordings_nest_even_when_equal():
    """An inner recording that added nothing (equal to the outer one, empty too) ends
    without ending the outer one, which goes on recording."""
    g = Graph("nest")
    x = g.add_input("x", TensorType((2,), "float32"))
    with g.recording() as outer:
        with g.recording() as inner:
            pass
        n = g.add_node("Neg", [x])
    assert inner == [] and outer == [n]


def test_checked_attributes_are_remembered_and_never_shared(monkeypatch):
    """Equal attributes are validated once per op; every node still gets its own dict and its
    own lists, and attributes that differ in value or type are validated anew."""
    from graphkernel import ops

    opdef = ops.get("ReduceSum")
    calls = []
    real = opdef.attrs.model_validate

    def counting(attrs):
        calls.append(dict(attrs))
        return real(attrs)

    monkeypatch.setattr(opdef, "_checked", {})
    monkeypatch.setattr(opdef, "_nodes", {})  # (add_node's memo in front of it)
    monkeypatch.setattr(opdef.attrs, "model_validate", counting)
    g = Graph("attrs")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    a = g.add_node("ReduceSum", [x], {"axis": [1], "keep_dims": True})
    b = g.add_node("ReduceSum", [x], {"axis": [1], "keep_dims": True})
    assert len(calls) == 1
    assert a.attrs == b.attrs and a.attrs is not b.attrs
    assert a.attrs["axis"] is not b.attrs["axis"]
    a.attrs["axis"].append(0)  # a rewrite changing one node's list leaves the other's
    assert b.attrs["axis"] == [1]
    c = g.add_node("ReduceSum", [x], {"axis": [1], "keep_dims": True})
    assert c.attrs["axis"] == [1] and len(calls) == 1
    g.add_node("ReduceSum", [x], {"axis": [1], "keep_dims": 1})  # 1 is not True
    g.add_node("ReduceSum", [x], {"axis": [0], "keep_dims": True})
    assert len(calls) == 3
    with pytest.raises(GraphError, match="keep_dims"):
        g.add_node("ReduceSum", [x], {"axis": [1], "keep_dims": "maybe"})
    with pytest.raises(GraphError, match="keep_dims"):  # a failure is never remembered
        g.add_node("ReduceSum", [x], {"axis": [1], "keep_dims": "maybe"})


def _moving_model() -> Graph:
    g = Graph("mv")
    x = g.add_input("x", TensorType((4, 8), "float32"))
    y = g.add_input("y", TensorType((4, 8), "float32"))
    a = g.add_node("Add", [x, y], name="a").output
    b = g.add_node("Mul", [a, a], name="b").output           # reads one value twice
    c = g.add_node("Sub", [b, x], name="c").output
    d = g.add_node("ReduceSum", [c], {"axis": [1], "keep_dims": True}, name="d").output
    e = g.add_node("Div", [c, d], name="e").output
    f = g.add_node("Neg", [b], name="f").output             # outside: reads a member
    g.set_outputs([g.add_node("Add", [e, f], name="out").output, x])
    return g


def _shape_of(g: Graph) -> list[tuple]:
    """Every node with its attributes, inputs, order, and each output's uses by name."""
    return [(n.op, n.name, n._seq, {k: v for k, v in n.attrs.items()},
             [v.name for v in n.inputs],
             [(v.name, str(v.type), [(u.name, j) for u, j in v.uses]) for v in n.outputs])
            for n in g.nodes]


def test_move_nodes_leaves_what_copying_leaves():
    """Moving members into a subgraph gives the subgraph ``clone_node`` gives, and leaves
    their outside inputs' use-lists as erasing the originals would."""
    moved_g, copied_g = _moving_model(), _moving_model()
    results = []
    for g, move in ((moved_g, True), (copied_g, False)):
        members = [g.node(n) for n in ("b", "c", "d", "e")]
        sub = Graph("k")
        vmap = {id(v): sub.add_input(v.name, v.type)
                for v in (g.value("a"), g.value("x"))}
        if move:
            g.move_nodes(members, sub, vmap)
            assert all(n.graph is sub for n in members)
        else:
            for n in members:
                sub.clone_node(n, vmap)
        results.append(sub)
    moved, copied = results
    # the outside reader of a moved value keeps reading it until the caller redirects it
    assert moved.value("b").uses[-1][0] is moved_g.node("f")
    moved_g.replace_input(moved_g.node("f"), 0, moved_g.value("y"))
    moved_g.replace_input(moved_g.node("out"), 0, moved_g.value("y"))
    moved.set_outputs([moved.value("e"), moved.value("b")])
    copied.set_outputs([copied.value("e"), copied.value("b")])
    moved.validate()
    copied.validate()
    assert _shape_of(moved) == _shape_of(copied)
    assert [(u.name, j) for u, j in moved_g.value("a").uses] == []
    assert [(u.name, j) for u, j in moved_g.value("x").uses] == [("a", 0)]
    assert not moved_g.has_node("b") and not moved_g.has_value("e")


def test_a_kernel_moves_its_members_or_copies_them_when_they_make_a_graph_output():
    """``build_kernel`` gives the same kernel either way: by moving (no member output is a
    graph output) or by copying (one is, so its name passes to the kernel's output)."""
    from graphkernel.interpreter import random_inputs
    from graphkernel.kernels import build_kernel

    for outputs in ("inner", "outer"):
        g = _moving_model()
        if outputs == "inner":  # b becomes a graph output too
            g.set_outputs([*g.outputs, g.value("b")], [*g.output_names, "b"])
        feeds = random_inputs(g, 0)
        want = run_graph(g, feeds)
        members = [g.node(n) for n in ("b", "c", "d", "e")]
        k = build_kernel(g, members, "k", "test")
        g.validate()
        moved = all(n.graph is k.subgraph for n in members)
        assert moved == (outputs == "outer")
        assert [n.name for n in k.subgraph.nodes] == ["b", "c", "d", "e"]
        assert [v.name for v in k.subgraph.inputs] == ["a", "x"]
        for a, b in zip(want, run_graph(g, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------- add_node's memo
def test_add_node_remembers_checks_and_types_per_attributes_and_input_types():
    """``OpDef.node_types`` gives what ``check_attrs``, ``check_arity`` and ``infer_types``
    give; an equal node later gets it from the memo (its own lists), other attributes or
    input types get their own."""
    from graphkernel import ops

    op = ops.get("Transpose")
    op._nodes.clear()
    g = Graph()
    x = g.add_input("x", TensorType((2, 3, 8), "float32"))
    h = g.add_input("h", TensorType((2, 3, 8), "float16"))
    a = g.add_node("Transpose", [x], {"perm": [0, 2, 1]})
    assert len(op._nodes) == 1
    b = g.add_node("Transpose", [x], {"perm": [0, 2, 1]})
    assert len(op._nodes) == 1
    assert a.attrs == b.attrs and a.attrs["perm"] is not b.attrs["perm"]
    assert a.output.type == b.output.type == TensorType((2, 8, 3), "float32")
    c = g.add_node("Transpose", [x], {"perm": [1, 0, 2]})
    d = g.add_node("Transpose", [h], {"perm": [0, 2, 1]})
    assert len(op._nodes) == 3
    assert c.output.type == TensorType((3, 2, 8), "float32")
    assert d.output.type == TensorType((2, 8, 3), "float16")
    norm = op.check_attrs({"perm": [0, 2, 1]})
    assert op.node_types({"perm": [0, 2, 1]}, [x.type]) == (
        norm, op.infer_types([x.type], norm))
    b.attrs["perm"].reverse()  # (no node shares the memo's list)
    assert g.add_node("Transpose", [x], {"perm": [0, 2, 1]}).attrs["perm"] == [0, 2, 1]


def test_add_node_still_refuses_what_the_checks_refuse_after_an_equal_node():
    from graphkernel.errors import GraphKernelError

    g = Graph()
    x = g.add_input("x", TensorType((2, 3), "float32"))
    g.add_node("Transpose", [x], {"perm": [1, 0]})
    with pytest.raises(GraphKernelError, match="takes 1 inputs, got 2"):
        g.add_node("Transpose", [x, x], {"perm": [1, 0]})
    with pytest.raises(GraphKernelError, match="perm"):
        g.add_node("Transpose", [x], {"perm": [1, 0, 2]})
