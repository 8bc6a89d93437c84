import numpy as np

from graphkernel import Graph, TensorType
from tests.passes.conftest import apply_pass, assert_same_results, ops_of


def test_merges_identical_nodes_and_constants():
    g = Graph()
    x = g.add_input("x", TensorType((4,), "float32"))
    c1 = g.const(np.float32(2.0), name="c1")
    c2 = g.const(np.float32(2.0), name="c2")
    a = g.add_node("Mul", [x, c1], name="a").output
    b = g.add_node("Mul", [x, c2], name="b").output
    s1 = g.add_node("ReduceSum", [a], {"axis": [0]}, name="s1").output
    s2 = g.add_node("ReduceSum", [b], {"axis": [0]}, name="s2").output
    s3 = g.add_node("ReduceSum", [b], {"axis": [0], "keep_dims": True}, name="s3").output
    g.set_outputs([g.add_node("Add", [s1, s2], name="out").output, s3])
    h, res = apply_pass("cse", g)
    assert res.rewrites == 3  # c2 -> c1, b -> a, s2 -> s1; s3 differs in keep_dims
    assert ops_of(h) == ["Mul", "ReduceSum", "ReduceSum", "Add"]
    assert set(h.node("a").origin) == {"a", "b"}  # the survivor speaks for both user nodes
    assert_same_results(g, h)


def test_does_not_merge_assign_or_opaque():
    g = Graph()
    p = g.add_input("p", TensorType((2,), "float32"), mutable=True)
    v = g.add_node("Exp", [p]).output
    g.add_node("Assign", [p, v], name="u1")
    g.add_node("Assign", [p, v], name="u2")
    g.set_outputs([v])
    h, res = apply_pass("cse", g)
    assert res.rewrites == 0 and h.has_node("u2")


def test_merges_equal_constants_of_every_dtype_only():
    g = Graph()
    x = g.add_input("x", TensorType((2, 3), "float16"))
    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    c1, c2 = g.const(w, name="c1"), g.const(w.copy(), name="c2")
    c3 = g.const(np.asfortranarray(w), name="c3")  # the same values, laid out otherwise
    c4 = g.const(w + np.float16(1), name="c4")
    outs = [g.add_node("Mul", [x, c], name=f"m{i}").output for i, c in enumerate((c1, c2, c3, c4))]
    g.set_outputs([g.add_node("AddN", outs, name="sum").output])
    h, res = apply_pass("cse", g)
    assert [n.name for n in h.nodes if n.op == "Constant"] == ["c1", "c4"]
    assert_same_results(g, h)


def test_constants_are_digested_only_when_their_samples_meet(monkeypatch):
    """Equal constants merge and constants differing only inside (same first and last
    elements) do not; a constant nothing else resembles is never digested."""
    from graphkernel import structure

    digested = []
    digest = structure.array_digest
    monkeypatch.setattr(structure, "array_digest", lambda a: digested.append(a.size) or digest(a))
    g = Graph()
    x = g.add_input("x", TensorType((64,), "float32"))
    base = np.arange(64, dtype=np.float32)
    inner = base.copy()
    inner[30] = -1.0
    lone = np.full(64, 7.0, np.float32)
    vals = [g.const(a, name=n) for a, n in ((base, "w1"), (base.copy(), "w2"), (inner, "w3"),
                                             (lone, "w4"))]
    outs = [g.add_node("Add", [x, v], name=f"o{i}").output for i, v in enumerate(vals)]
    g.set_outputs(outs)
    h, res = apply_pass("cse", g)
    assert res.rewrites == 2  # w2 -> w1 (then o1 -> o0); w3 differs inside, w4 is alone
    assert sorted(n.name for n in h.nodes if n.op == "Constant") == ["w1", "w3", "w4"]
    assert len(digested) == 3  # w1, w2 and w3, never w4
    assert_same_results(g, h)


def test_merges_slices_taking_the_same_elements():
    """``x[..., -1:]``, ``x[..., 7:8]`` (strides unset) and ``x[..., 7:huge]`` take the same
    elements of a static last axis of 8: one slice; another position, a step, or a symbolic
    axis keeps its own."""
    g = Graph()
    x = g.add_input("x", TensorType((2, 3, 8), "float32"))
    big = 9223372036854775807
    spelt = [({"begin": [-1], "end": [big], "strides": [1], "axes": [2]}, "a"),
             ({"begin": [7], "end": [8], "strides": None, "axes": [2]}, "b"),
             ({"begin": [7], "end": [big], "strides": [1], "axes": [-1]}, "c"),
             ({"begin": [6], "end": [7], "strides": [1], "axes": [2]}, "d"),
             ({"begin": [-1], "end": [-9], "strides": [-2], "axes": [2]}, "e")]
    outs = [g.add_node("StridedSlice", [x], attrs, name=name).output for attrs, name in spelt]
    g.set_outputs(outs)
    h, res = apply_pass("cse", g)
    assert res.rewrites == 2  # b -> a, c -> a
    assert [n.name for n in h.nodes if n.op == "StridedSlice"] == ["a", "d", "e"]
    assert_same_results(g, h)

    s = Graph()
    y = s.add_input("y", TensorType(("L", 8), "float32"))
    s.set_outputs([s.add_node("StridedSlice", [y], attrs | {"axes": [1]}, name=name).output
                   for attrs, name in spelt[:2]])
    _, res = apply_pass("cse", s)
    assert res.rewrites == 0  # (a symbolic dim: compared as spelt)


def test_slice_merge_saves_launches_on_a_scan_read_twice():
    """A scan's row totals taken twice (``cs[..., -1:]`` to subtract, ``cs[..., -1]`` to pad
    before a second scan): through the pipeline one slice kernel, not two."""
    from graphkernel import compile as gk_compile
    from graphkernel.codegen.traffic import launches

    g = Graph()
    x = g.add_input("x", TensorType((2, 4, 3, 8), "float32"))
    cs = g.add_node("CumSum", [x], {"axis": 3}, name="cs").output
    last = g.add_node("StridedSlice", [cs], {"begin": [-1], "end": [9223372036854775807],
                                             "strides": [1], "axes": [3]}, name="last").output
    sel = g.add_node("StridedSlice", [cs], {"begin": [7], "end": [8], "axes": [3]},
                     name="sel").output
    sq = g.add_node("Squeeze", [sel], {"axis": [3]}, name="sq").output
    z = g.add_node("BroadcastTo", [g.const(np.float32(0))], {"shape": [2, 4, 1]}).output
    pad = g.add_node("Concat", [z, sq], {"axis": 2}, name="pad").output
    decay = g.add_node("Exp", [g.add_node("Sub", [last, cs], name="sub").output]).output
    g.set_outputs([decay, g.add_node("Exp", [pad], name="n").output])

    def slices_and_launches(flags: str) -> tuple[int, int]:
        got = launches(gk_compile(g, flags, env={}).graph)
        return sum(e["op"] == "StridedSlice" for e in got), len(got)

    spelt, merged = slices_and_launches("--disable_pass=cse"), slices_and_launches("")
    assert spelt[0] == 2 and merged[0] == 1
    assert merged[1] < spelt[1]
