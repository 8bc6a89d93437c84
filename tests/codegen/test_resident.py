"""Resident tables (codegen/vector/resident.py): a rotary embedding's cos and sin [S, D], broadcast
over the leading axes of x [B, N, S, D], or [1, S, 1, D], broadcast over the batch and the
heads of x [B, S, N, D] (a middle axis), are loaded once per core and kept in UB; the
simulator counts each input's GM reads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphkernel import Graph, TensorType
from graphkernel.codegen import targets
from graphkernel.codegen.kernel_ir import Kind
from graphkernel.codegen.legalize import check
from graphkernel.codegen.sim.execute import SimLibrary
from graphkernel.codegen.sim.runner import SimulatorError
from graphkernel.codegen.vector import resident
from graphkernel.codegen.vector.render import render
from graphkernel.kernels import build_kernel

SPEC = targets.load("ascend910b")


def _op(g, op, ins, **a):
    return g.add_node(op, ins, a).output


def rotary_kernel(x_shape: tuple[int, ...], table: tuple[int, ...], dtype: str = "float32"):
    """y = x * cos + cat(-x2, x1) * sin, the halves x1, x2 of x's last axis (one kernel)."""
    g = Graph("rotary")
    x = g.add_input("x", TensorType(x_shape, dtype))
    cos = g.add_input("cos", TensorType(table, dtype))
    sin = g.add_input("sin", TensorType(table, dtype))
    h = x_shape[-1] // 2
    last = len(x_shape) - 1
    x1 = _op(g, "StridedSlice", [x], begin=[0], end=[h], strides=[1], axes=[last])
    x2 = _op(g, "StridedSlice", [x], begin=[h], end=[2 * h], strides=[1], axes=[last])
    rot = _op(g, "Concat", [_op(g, "Neg", [x2]), x1], axis=last)
    g.set_outputs([_op(g, "Add", [_op(g, "Mul", [x, cos]), _op(g, "Mul", [rot, sin])])])
    k = build_kernel(g, [n for n in g.nodes if n.op != "Constant"], "rotary", "test")
    return k, check(k, SPEC)


def reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    x32, c32, s32 = (a.astype(np.float32) for a in (x, cos, sin))
    rot = np.concatenate([-x32[..., h:], x32[..., :h]], axis=-1)
    return x32 * c32 + rot * s32


def run(x_shape, table, dtype="float32", seed=0, edit=None):
    _, s = rotary_kernel(x_shape, table, dtype)
    r = render(s)
    if edit is not None:
        r = dataclasses.replace(r, files={k: edit(v) if k == f"{s.name}.cpp" else v
                                          for k, v in r.files.items()})
    rng = np.random.default_rng(seed)
    feeds = [rng.standard_normal(shape).astype(dtype) for shape in (x_shape, table, table)]
    launch = SimLibrary([r]).run(r.name, feeds, SPEC)
    return s, r, feeds, launch


def table_rows_loaded(fields: dict[str, int], rows: int, repeat: int = 1) -> int:
    """Table rows the cores load from GM, by the placement resident.py documents: a core's
    whole blocks (``rows`` rows of the loop space) take the table once; chunks of blocks
    (unit u: chunk u / blocks of block u % blocks) take the chunks its units span. Each GM
    row serves ``repeat`` consecutive rows of a block: a core loads the GM rows its span
    touches."""
    n_outer, rt = fields["M"] // rows, fields["rt"]
    base, extra = divmod(fields["units"], fields["blockDim"])
    total = 0
    for b in range(fields["blockDim"]):
        first = b * base + min(b, extra)
        last = first + base + (1 if b < extra else 0)
        if rt >= rows:
            total += rows // repeat
        else:
            a = first // n_outer * rt
            e = min(rows, ((last - 1) // n_outer + 1) * rt)
            total += -(-e // repeat) - a // repeat
    return total


@pytest.mark.parametrize("x_shape,table,dtype", [
    ((2, 4, 16, 16), (16, 16), "float32"),      # a core's share is less than a block
    ((16, 8, 8, 32), (1, 1, 8, 32), "float32"),  # shares of several whole blocks
    ((3, 5, 24, 64), (24, 64), "float16"),
], ids=["chunks", "whole-blocks", "fp16"])
def test_tables_are_read_once_per_core_and_the_result_matches(x_shape, table, dtype):
    s, r, (x, cos, sin), launch = run(x_shape, table, dtype)
    rows = x_shape[-2]
    assert [io.table for io in s.inputs] == [0, rows, rows]
    assert [b.name for b in r.plan.buffers if b.kind == Kind.TABLE] == ["qt1", "qt2"]
    got = launch.outputs[0].astype(np.float32)
    tol = 1e-6 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(got, reference(x, cos, sin), rtol=tol, atol=tol)
    reads = launch.counts.reads
    row_bytes = x_shape[-1] * x.itemsize
    m = int(np.prod(x_shape[:-1]))
    assert reads[0] == x.nbytes  # x: every row once
    for i in (1, 2):  # each core its table rows once, far fewer than a row per row
        assert reads[i] == table_rows_loaded(launch.tiling, rows) * row_bytes
        assert reads[i] <= launch.block_dim * cos.nbytes
        assert reads[i] < m * row_bytes
    assert sum(reads) == launch.counts.gm_read


def test_whole_blocks_repeat_the_table_in_ub_not_from_gm():
    """Tiles of several blocks read the table repeated in UB: each core reads it from GM
    exactly once."""
    _, _, (_, cos, _), launch = run((16, 8, 8, 32), (1, 1, 8, 32))
    assert launch.tiling["rt"] > 8 and launch.tiling["rt"] % 8 == 0
    assert launch.counts.reads[1] == launch.block_dim * cos.nbytes


def test_the_repeat_needs_its_vector_barrier():
    """The copies that repeat a table in UB read what the copy before wrote (four blocks per
    core: the second copy reads the first's): without the barrier after each copy the
    simulator's pipe model refuses the kernel."""
    copy = "Or(x[have * words], x, x, (int32_t)(n * words));"

    def drop(src: str) -> str:
        assert f"{copy}\n                PipeBarrier<PIPE_V>();" in src
        return src.replace(f"{copy}\n                PipeBarrier<PIPE_V>();", copy)

    shape, table = (24, 8, 8, 32), (8, 32)
    _, _, (x, cos, sin), launch = run(shape, table)
    assert launch.tiling["rt"] == 4 * 8
    np.testing.assert_allclose(launch.outputs[0], reference(x, cos, sin), rtol=1e-6, atol=1e-6)
    with pytest.raises(SimulatorError, match="PipeBarrier<PIPE_V>"):
        run(shape, table, edit=drop)


def test_a_table_too_large_for_the_ub_keeps_the_per_tile_load():
    """A table beyond a quarter of the UB (512 rows of 32 fp32: 64 KiB) is loaded with every
    tile as before, and the kernel still matches."""
    s, r, (x, cos, sin), launch = run((2, 2, 512, 32), (512, 32))
    assert all(io.table == 0 for io in s.inputs)
    assert not any(b.kind == Kind.TABLE for b in r.plan.buffers)
    assert [io.kind for io in s.inputs][1:] == ["partial", "partial"]
    assert {"qi1", "qi2"} <= {b.name for b in r.plan.buffers if b.is_queue and b.depth == 2}
    np.testing.assert_allclose(launch.outputs[0], reference(x, cos, sin), rtol=1e-6, atol=1e-6)
    assert launch.counts.reads[1] == 2 * 2 * 512 * 32 * 4  # a table row for every row


def test_a_resident_table_is_described_with_the_kernel():
    _, s = rotary_kernel((2, 4, 16, 16), (16, 16))
    r = render(s)
    assert any("table of 16 rows" in n and "once" in n for n in r.manifest["notes"])
    assert {"name": "qt1", "position": "VECIN", "depth": 1}.items() <= next(
        b for b in r.manifest["buffers"] if b["name"] == "qt1").items()


def test_a_symbolic_batch_keeps_the_table_resident():
    """Leading axes may be symbolic (R, the table's rows, is static): one kernel serves a
    batch of 1 (chunks of blocks) and of 50 (whole blocks), reading each table at most once
    per core."""
    _, s = rotary_kernel(("b", 4, 16, 16), (16, 16))
    assert [io.table for io in s.inputs] == [0, 16, 16]
    r = render(s)
    lib = SimLibrary([r])
    for b in (1, 50):
        rng = np.random.default_rng(b)
        x, cos, sin = (rng.standard_normal(shape).astype(np.float32)
                       for shape in ((b, 4, 16, 16), (16, 16), (16, 16)))
        launch = lib.run(r.name, [x, cos, sin], SPEC)
        np.testing.assert_allclose(launch.outputs[0], reference(x, cos, sin), rtol=1e-6,
                                   atol=1e-6)
        assert launch.counts.reads[1] == table_rows_loaded(launch.tiling, 16) * 16 * 4
        assert launch.counts.reads[1] <= launch.block_dim * cos.nbytes


# Rotary embedding in BSND: x [B, S, N, D], cos and sin [1, S, 1, D] broadcast over the heads
# N (a middle axis) as well as the batch: each table row serves N consecutive rows.
@pytest.mark.parametrize("x_shape,table,repeat,dtype", [
    ((2, 16, 4, 16), (1, 16, 1, 16), 4, "float32"),   # a core's share is less than a block
    ((64, 8, 4, 32), (1, 8, 1, 32), 4, "float32"),    # shares of several whole blocks
    ((40, 4, 64), (40, 1, 64), 4, "float16"),         # no leading axis: one block
    ((5, 6, 3, 2, 32), (6, 1, 1, 32), 6, "float32"),  # two middle axes (6 consecutive rows)
], ids=["chunks", "whole-blocks", "fp16-one-block", "two-middle-axes"])
def test_a_table_broadcast_over_middle_axes_is_read_once_per_core(x_shape, table, repeat,
                                                                   dtype):
    s, r, (x, cos, sin), launch = run(x_shape, table, dtype)
    rows = int(np.prod(table[:-1])) * repeat  # rows of the loop space one table copy serves
    assert [io.table for io in s.inputs] == [0, rows, rows]
    assert [io.table_repeat for io in s.inputs] == [1, repeat, repeat]
    got = launch.outputs[0].astype(np.float32)
    tol = 1e-6 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(got, reference(x, cos, sin), rtol=tol, atol=tol)
    reads = launch.counts.reads
    row_bytes = x_shape[-1] * x.itemsize
    assert reads[0] == x.nbytes
    for i in (1, 2):
        assert reads[i] == table_rows_loaded(launch.tiling, rows, repeat) * row_bytes
        assert reads[i] <= launch.block_dim * cos.nbytes  # at most the table once per core
        assert reads[i] < int(np.prod(x_shape[:-1])) * row_bytes // 2
    assert sum(reads) == launch.counts.gm_read


def test_whole_blocks_of_a_middle_axis_table_read_it_once_per_core():
    """Tiles of whole blocks: each core reads each table from GM exactly once, however many
    rows and heads its tiles cover."""
    _, _, (_, cos, sin), launch = run((64, 8, 4, 32), (1, 8, 1, 32))
    assert launch.tiling["rt"] >= 8 * 4 and launch.tiling["rt"] % (8 * 4) == 0
    assert launch.counts.reads[1] == launch.counts.reads[2] == launch.block_dim * cos.nbytes


def test_the_spread_of_table_rows_needs_its_vector_barrier():
    """Copying a table row to the rows after it runs in doubling runs (4 heads: row 0 to 1,
    then rows 0-1 to 2-3): the second run reads what the first wrote, so without the barrier
    after each run the simulator's pipe model refuses the kernel."""
    copy = "(int32_t)(n * words));\n            PipeBarrier<PIPE_V>();"

    def drop(src: str) -> str:
        assert copy in src
        return src.replace(copy, "(int32_t)(n * words));")

    shape, table = (2, 16, 4, 16), (1, 16, 1, 16)
    _, _, (x, cos, sin), launch = run(shape, table)
    np.testing.assert_allclose(launch.outputs[0], reference(x, cos, sin), rtol=1e-6, atol=1e-6)
    with pytest.raises(SimulatorError, match="PipeBarrier<PIPE_V>"):
        run(shape, table, edit=drop)


def test_a_middle_axis_table_is_described_with_the_kernel():
    _, s = rotary_kernel((2, 16, 4, 16), (1, 16, 1, 16))
    r = render(s)
    assert any("table of 16 rows, each serving 4 consecutive rows" in n
               for n in r.manifest["notes"])
    assert not any("re-read" in n for n in r.manifest["notes"])


def test_a_broadcast_between_the_table_axes_keeps_the_per_tile_load():
    """cos [1, S, 1, H, D] under x [B, S, N, H, D]: its rows are not one run of rows each
    repeated, so they stay loaded with every tile (and the kernel still matches)."""
    s, _, (x, cos, sin), launch = run((2, 4, 3, 2, 16), (1, 4, 1, 2, 16))
    assert all(io.table == 0 for io in s.inputs)
    assert resident.table_map(s.inputs[1]) is None
    np.testing.assert_allclose(launch.outputs[0], reference(x, cos, sin), rtol=1e-6, atol=1e-6)


def test_the_table_map_of_a_bsnd_rotary_table():
    _, s = rotary_kernel((2, 16, 4, 16), (1, 16, 1, 16))
    assert resident.table_map(s.inputs[1]) == resident.TableMap(rows=16, pitch=16, repeat=4)
    assert resident.table_map(s.inputs[1]).block == 64
    _, s = rotary_kernel((2, 4, 16, 16), (16, 16))
    assert resident.table_map(s.inputs[1]) == resident.TableMap(rows=16, pitch=16, repeat=1)


def test_a_symbolic_batch_keeps_a_middle_axis_table_resident():
    """BSND with a symbolic batch (the heads and the table static): one kernel serves a batch
    of 1 and 40 (chunks of the block) and of 200 (whole blocks), reading each table at most
    once per core."""
    _, s = rotary_kernel(("b", 16, 4, 16), (1, 16, 1, 16))
    assert [io.table for io in s.inputs] == [0, 64, 64]
    r = render(s)
    lib = SimLibrary([r])
    for b in (1, 40, 200):
        rng = np.random.default_rng(b)
        x, cos, sin = (rng.standard_normal(shape).astype(np.float32)
                       for shape in ((b, 16, 4, 16), (1, 16, 1, 16), (1, 16, 1, 16)))
        launch = lib.run(r.name, [x, cos, sin], SPEC)
        np.testing.assert_allclose(launch.outputs[0], reference(x, cos, sin), rtol=1e-6,
                                   atol=1e-6)
        for i in (1, 2):
            assert launch.counts.reads[i] == table_rows_loaded(launch.tiling, 64, 4) * 16 * 4
            assert launch.counts.reads[i] <= launch.block_dim * cos.nbytes
        if b < 200:  # chunks of whole groups of 4 rows, or parts of one (40: 7 rows made 4)
            rt = launch.tiling["rt"]
            assert rt == {1: 2, 40: 4}[b]
        if b == 200:  # whole blocks: the table exactly once per core
            assert launch.tiling["rt"] % 64 == 0
            assert launch.counts.reads[1] == launch.block_dim * cos.nbytes


def test_a_symbolic_head_count_keeps_the_per_tile_load():
    """The heads a table row serves must be static (the copies in UB are counted at
    generation): with symbolic heads the table is loaded with every tile."""
    _, s = rotary_kernel((2, 16, "n", 16), (1, 16, 1, 16))
    assert all(io.table == 0 for io in s.inputs)


def test_a_partial_rotary_in_bsnd_repeats_its_table_columns():
    """Rotary over the first 32 of 64 columns (the rest passed through), x [B, S, N, D]:
    cos and sin [1, S, 1, 32] are loaded into the first 32 columns of the slot's rows and
    repeated for the heads; each core reads each table at most once."""
    x_shape, table = (4, 16, 4, 64), (1, 16, 1, 32)
    g = Graph("rotary_partial")
    x = g.add_input("x", TensorType(x_shape, "float32"))
    cos = g.add_input("cos", TensorType(table, "float32"))
    sin = g.add_input("sin", TensorType(table, "float32"))

    def cols(v, a, b):
        return _op(g, "StridedSlice", [v], begin=[a], end=[b], strides=[1], axes=[3])

    xr = cols(x, 0, 32)
    rot = _op(g, "Concat", [_op(g, "Neg", [cols(xr, 16, 32)]), cols(xr, 0, 16)], axis=3)
    y = _op(g, "Add", [_op(g, "Mul", [xr, cos]), _op(g, "Mul", [rot, sin])])
    g.set_outputs([_op(g, "Concat", [y, cols(x, 32, 64)], axis=3)])
    k = build_kernel(g, [n for n in g.nodes if n.op != "Constant"], "rotary_partial", "test")
    s = check(k, SPEC)
    assert [(io.table, io.table_repeat, io.columns) for io in s.inputs] == [
        (0, 1, None), (64, 4, (0, 32)), (64, 4, (0, 32))]
    r = render(s)
    rng = np.random.default_rng(3)
    feeds = [rng.standard_normal(shape).astype(np.float32) for shape in (x_shape, table, table)]
    launch = SimLibrary([r]).run(r.name, feeds, SPEC)
    xv, c, sn = feeds
    want = np.concatenate([reference(xv[..., :32], c, sn), xv[..., 32:]], axis=-1)
    np.testing.assert_allclose(launch.outputs[0], want, rtol=1e-6, atol=1e-6)
    for i in (1, 2):
        assert launch.counts.reads[i] == table_rows_loaded(launch.tiling, 64, 4) * 32 * 4
        assert launch.counts.reads[i] <= launch.block_dim * c.nbytes
