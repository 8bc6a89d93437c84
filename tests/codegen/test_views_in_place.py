"""Slices and transposes read by several kernels, loaded in place by each (passes/recompute.py),
and the vector schedule's view of a reshape that splits a strided slice's axis: launch counts
through the pipeline, the rewrite's refusals, and the simulator's numbers."""

from __future__ import annotations

import numpy as np
import pytest

import graphkernel
from graphkernel.codegen.traffic import launch_io, launches
from graphkernel.codegen.vector.schedule import View, plan, unit_axes_view
from graphkernel.kernels import build_kernel
from tests.codegen.cases import pattern_cases, sim_ok

CASES = {c.id: c for c in pattern_cases()}
OFF = "--enable_recompute_fusion=false"


def _case(case_id: str):
    case = CASES[case_id]
    return case.graph, case.flags


@pytest.mark.parametrize("shape,begin,new", [
    ((2, 16, 160), 0, (2, 16, 8, 16)),
    ((2, 16, 160), 128, (2, 16, 2, 16)),
    ((2, 16, 160), 16, (32, 8, 16)),
])
def test_a_reshape_of_a_column_slice_is_a_strided_view_where_numpy_puts_it(shape, begin,
                                                                          new):
    """Columns ``begin:begin + w`` of rows of 160, split into heads (and rows merged): each
    element's place by the view is its place in the sliced input, as numpy finds it."""
    w = int(np.prod(new)) // (shape[0] * shape[1])
    y = np.arange(int(np.prod(shape))).reshape(shape)
    want = y[..., begin:begin + w].reshape(new)
    src = (shape[0], shape[1], w)
    view = unit_axes_view(View(begin, (shape[1] * shape[2], shape[2], 1)), src, new)
    assert view is not None
    for idx in np.ndindex(*new):
        at = view.base + sum(i * s for i, s in zip(idx, view.strides, strict=True))
        assert y.reshape(-1)[at] == want[idx]


def test_a_reshape_merging_axes_not_laid_end_to_end_is_no_view():
    """Rows of a column slice merged with the columns (``[2, 16, 128]`` of rows of 160 as
    ``[2, 2048]``) do not lie one after another: no single view, refused as before."""
    view = View(0, (16 * 160, 160, 1))
    assert unit_axes_view(view, (2, 16, 128), (2, 2048)) is None
    assert unit_axes_view(view, (2, 16, 128), (2, 16, 128 // 3 * 3)) is None


def test_a_kernel_splitting_a_sliced_axis_into_heads_is_scheduled_and_exact():
    """A slice of a kernel input's columns, viewed as heads, times a per-head value: one
    kernel (before: refused, 'no row split suits every broadcast and slice', run op by op),
    and the simulator's numbers match."""
    g, flags = _case("slice-then-head-split")
    kernel = g.copy()
    plan(build_kernel(kernel, list(kernel.nodes), "k", "test"))  # (no Unsupported)
    res = graphkernel.compile(g, flags, env={})
    assert len(launches(res.graph)) == 1 and not res.report.extra["fallbacks"]
    sim_ok(res, g)


def test_a_part_read_by_two_kernels_is_loaded_in_place_by_both():
    """The first 128 columns of a projection read by the gate before a product and by the
    skip term after it: the slice's own launch goes, each reader loads the columns (the same
    bytes it read from the slice), and the simulator's numbers match."""
    g, flags = _case("slice-read-in-place-by-two-kernels")
    off = graphkernel.compile(g, f"{flags} {OFF}", env={})
    on = graphkernel.compile(g, flags, env={})
    assert len(launches(on.graph)) == len(launches(off.graph)) - 1
    assert not any(e["op"] == "StridedSlice" for e in launches(on.graph))
    total = lambda res: sum(r + w for _, r, w in launch_io(res.graph))  # noqa: E731
    assert total(on) < total(off)
    rec = next(p for p in on.report.passes if p.name == "recompute")
    assert any("loaded in place by 2 kernel(s)" in note for note in rec.notes), rec.notes
    sim_ok(on, g)


def test_a_slice_also_read_outside_a_kernel_or_as_an_output_stays():
    """A slice that is a graph output, or that an op outside every kernel reads (not
    elementwise), is kept: its readers would not save its launch."""
    g, flags = _case("slice-read-in-place-by-two-kernels")
    g = g.copy()
    heads = next(n for n in g.nodes if n.op == "Reshape")  # the part as heads
    g.set_outputs([*g.outputs, heads.outputs[0]])
    res = graphkernel.compile(g, flags, env={})
    rec = next(p for p in res.report.passes if p.name == "recompute")
    assert not any("loaded in place" in note for note in rec.notes)


def test_a_reader_refusing_the_view_keeps_the_slice():
    """A reader whose code generator would not take the slice in place (a matrix product's
    epilogue reading it: no tile of the product) keeps the slice materialized."""
    g, flags = _case("slice-read-in-place-by-two-kernels")
    g = g.copy()
    skip = g.outputs[0].producer  # the Add after the product: made the product's epilogue
    exp = skip.inputs[0].producer
    g.replace_input(skip, 0, exp.inputs[0].producer.inputs[0])
    res = graphkernel.compile(g, flags, env={})
    rec = next(p for p in res.report.passes if p.name == "recompute")
    assert not any("loaded in place" in note for note in rec.notes)
    assert any(e["op"] == "StridedSlice" or "StridedSlice" in (e.get("op_list") or [])
               for e in launches(res.graph))


def test_with_the_memory_guard_on_no_slice_is_moved_into_its_readers():
    """A reader loading the slice later keeps the sliced value alive until it runs; with
    ``peak_memory_growth`` set, the pass leaves slices alone (and says so)."""
    g, flags = _case("slice-read-in-place-by-two-kernels")
    res = graphkernel.compile(g, f"{flags} --peak_memory_growth=10", env={})
    rec = next(p for p in res.report.passes if p.name == "recompute")
    assert not any("loaded in place" in note for note in rec.notes)
    assert any("peak_memory_growth" in note for note in rec.notes)
