"""Einsum equations lowered to graphkernel ops agree with numpy's einsum; what is not modelled
(a diagonal, broadcasting of a size-1 index) is refused with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.frontends.einsum import EinsumUnsupported, lower_einsum
from graphkernel.interpreter import run_graph


def _run(eq: str, *shapes):
    rng = np.random.default_rng(len(eq))
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g = Graph("einsum")
    ins = [g.add_input(f"x{i}", TensorType(s, "float32")) for i, s in enumerate(shapes)]

    def emit(op, inputs, attrs):
        return g.add_node(op, inputs, attrs).output

    g.set_outputs([lower_einsum(eq, list(ins), emit)])
    (got,) = run_graph(g, xs)
    return g, got, np.einsum(eq, *xs)


@pytest.mark.parametrize("eq,shapes", [
    ("bhld,bhsd->bhls", [(2, 3, 5, 4), (2, 3, 6, 4)]),   # attention scores
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),                          # implicit output
    ("ab,b->a", [(3, 4), (4,)]),                          # a matrix-vector product
    ("i,j->ij", [(3,), (4,)]),                            # an outer product: nothing contracted
    ("bij->bji", [(2, 3, 4)]),
    ("ij->", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("bclhn,bcshn->bclsh", [(2, 2, 4, 3, 5), (2, 2, 4, 3, 5)]),  # a chunked scan's scores
    ("bcshn,bcshp->bchpn", [(2, 2, 4, 3, 5), (2, 2, 4, 3, 6)]),  # its chunk states
    ("ijk,ik->j", [(3, 4, 5), (3, 5)]),                   # a letter summed from one side first
])
def test_equations_agree_with_numpy(eq, shapes):
    g, got, want = _run(eq, *shapes)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    contracted = eq not in ("i,j->ij", "bij->bji", "ij->")
    assert any(n.op in ("MatMul", "BatchMatMul") for n in g.nodes) == contracted


@pytest.mark.parametrize("eq,shapes,why", [
    ("ii->i", [(3, 3)], "diagonal"),
    ("ij,ij->ij", [(3, 1), (3, 4)], "broadcasting"),
    ("ij,jk->ik", [(3, 4), (4, 5), (5,)], "operands"),
])
def test_what_is_not_modelled_is_refused(eq, shapes, why):
    with pytest.raises(EinsumUnsupported, match=why):
        _run(eq, *shapes)
