"""The layout choices of a vector schedule that hang on its UB budget, made before the kernel
is lowered for good: the variant that walks rows too long for the UB in chunks, and the
resident tables (``vector/resident.py``).

Each is decided from a trial lowering's buffer plan (the lowering is a pure function of the
schedule; its result is not kept) and gives a new schedule:

- a kernel reducing each row whose whole row does not fit the UB is replaced by its
  ``row_chunks`` variant (the reductions accumulated chunk by chunk), or refused when it has
  none;
- with a symbolic row length the choice is the host's at run time (tiling key 1): the variant
  rides along as ``Schedule.variant`` when it can be generated;
- otherwise inputs that are tables broadcast over the leading axes are held resident when
  the plan with them fits.
"""

from __future__ import annotations

from dataclasses import replace

from graphkernel.codegen.kernel_ir import KernelIR
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.targets import Target
from graphkernel.codegen.vector import resident
from graphkernel.codegen.vector.lower import lower
from graphkernel.codegen.vector.schedule import Schedule, plan
from graphkernel.codegen.vector.tiling import align_elems, budget, row_bytes
from graphkernel.ir import Node


def choose(kernel: Node, s: Schedule, ir: KernelIR, target: Target) -> Schedule:
    """The schedule of ``kernel`` with its layout choices made, from ``s`` (its plan) and
    ``ir`` (a trial lowering of it)."""
    if s.single_tile:  # an output transposed in UB: the whole loop space in one tile
        a = align_elems(s)
        need = budget(s, ir).bytes(int(s.M), -(-int(s.L) // a) * a)
        if need > target.ub_bytes:  # (named: the kernel is split around the transpose)
            t = next((n for n in kernel.subgraph.nodes if n.op == "Transpose"
                      and n.attrs["perm"][-1] != len(n.attrs["perm"]) - 1), None)
            raise Unsupported(f"a transpose in UB holds the whole loop space ({s.M} rows of "
                              f"{s.L}) in one tile: {need} bytes of UB, the target has "
                              f"{target.ub_bytes}", node=t)
        return s
    if s.whole_row_tiles:  # a scan's readout, or a reduction of the reduced row: its
        #                    column tile is the whole row
        need = row_bytes(s, ir)
        if need is None or need > target.ub_bytes:  # (a symbolic row: not known to fit)
            n = next((m for m in s.steps if id(m) in s.row_reduces), None)
            if n is not None:
                raise Unsupported(f"a reduction of each row in a scan's kernel holds the whole "
                                  f"row ({s.L} elements) in a column tile: {need} bytes of UB, "
                                  f"the target has {target.ub_bytes}", node=n)
            n = next((m for m in s.steps if id(m) in s.late_reduces), None)
            raise Unsupported(f"a reduction of the reduced row in the final steps holds the "
                              f"whole row ({s.L} elements) in a column tile: {need} bytes of "
                              f"UB, the target has {target.ub_bytes}", node=n)
        return s
    need = row_bytes(s, ir) if s.reduce else None
    if s.reduce and need is None:  # a symbolic row: the run-time shape picks the variant
        try:
            v = plan(kernel, row_chunks=True, target=target)
            lower(v)
        except Unsupported:
            return s  # whole rows only; the tiling function reports a row too long for the UB
        return replace(s, variant=replace(v, name=f"{s.name}_rc"))
    if need is not None and need > target.ub_bytes:
        try:  # the variant that walks each row in chunks
            v = plan(kernel, row_chunks=True, target=target)
            lower(v)
            return v
        except Unsupported as e:
            raise type(e)(f"a row of {s.L} elements needs {need} bytes of UB, the target has "
                      f"{target.ub_bytes}, and it cannot be walked in chunks: {e}", node=e.node,
                      about=e.about) from None
    return resident.choose(s)  # tables broadcast over the leading axes: loaded once per core
