"""The traffic model counts what a launch loads of an input it reads only through unit-step
slices: the slices (a slice of a kernel input is a strided load of the rows or columns it
keeps), the same rule for fused launches and for the ideal. A fused QKV projection cut into
Q, K and V columns (GPT-NeoX) is read once in all by the three launches that take its
parts, as by the one ideal kernel; an input also read whole, or sliced with a step, counts
whole."""

from __future__ import annotations

import numpy as np

import graphkernel
from graphkernel import Graph, TensorType
from graphkernel.codegen.traffic import ideal, launch_io, sliced_bytes
from graphkernel.fusion import nbytes


def _qkv(step: int = 1, whole_reader: bool = False) -> Graph:
    """[B, S, N, 3 D] cut into three column blocks: Q and K each scaled (a kernel of its
    own), V a slice alone (a launch of its own). ``whole_reader``: another op of Q's kernel
    reads the projection whole; ``step``: the slices take every ``step``-th column."""
    g = Graph("qkv")
    x = g.add_input("x", TensorType((2, 16, 192), "float32"))
    x = g.add_node("Reshape", [x], {"shape": [2, 16, 4, 48]}).output  # (the heads: a view)
    outs = []
    for k in range(3):
        part = g.add_node("StridedSlice", [x], {"begin": [16 * k], "end": [16 * k + 16],
                                               "strides": [step], "axes": [3]}).output
        if k < 2:
            part = g.add_node("Mul", [part, g.const(np.float32(0.5 + k))]).output
        outs.append(part)
    if whole_reader:
        total = g.add_node("ReduceSum", [x], {"axis": [3], "keep_dims": True}).output
        outs[0] = g.add_node("Add", [outs[0], total]).output
    g.set_outputs(outs)
    return g


def _reads(res) -> int:
    return sum(r for _, r, _ in launch_io(res.graph))


def test_the_parts_of_a_sliced_projection_are_read_once_in_all():
    g = _qkv()
    # (the parts' launches kept apart: sibling_fusion would join them, below)
    res = graphkernel.compile(g, "--opt_level=2 --disable_pass=sibling_fusion", env={})
    x = nbytes(g.inputs[0])
    assert len(list(launch_io(res.graph))) == 3  # (the parts' launches: not one kernel)
    assert _reads(res) == x  # a third of the projection each, not all of it three times
    ex = res.report.extra
    assert ex["gm_bytes_fused"] == x + x  # read once, written once (three parts)
    assert ex["gm_bytes_fused"] <= ex["gm_bytes_ideal"]
    # V's lone slice joined to a kernel of its loop space reading the same projection: two
    # launches, the same reads
    joined = graphkernel.compile(g, "--opt_level=2", env={})
    assert len(list(launch_io(joined.graph))) == 2 and _reads(joined) == x


def test_the_ideal_counts_slices_by_the_same_rule():
    """The ideal's one kernel reads the three slices: the whole projection once."""
    g = _qkv()
    vector = {id(n) for n in g.nodes}
    total, count = ideal(g, vector)
    assert count == 1 and total == 2 * nbytes(g.inputs[0])


def test_an_input_also_read_whole_or_with_a_step_counts_whole():
    x = _qkv().inputs[0]
    step = _qkv(step=2)
    heads = step.inputs[0].users[0].outputs[0]
    assert sliced_bytes(heads, list(heads.users)) is None
    whole = _qkv(whole_reader=True)
    heads = whole.inputs[0].users[0].outputs[0]
    assert sliced_bytes(heads, list(dict.fromkeys(heads.users))) is None
    res = graphkernel.compile(whole, "--opt_level=2", env={})
    assert _reads(res) > nbytes(x)
