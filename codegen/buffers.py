"""The buffer plan: every Unified Buffer allocation of a kernel, from its kernel IR's buffers.

The lowering records each buffer it takes (``codegen/kernel_ir.py``: the kernel's queues and
scratch of every kind, in ``InitBuffer`` order); the plan is those records and one block of
slack, computed once, so that

- the tiling's UB budget is the plan's sum (``BufferPlan.budget``),
- the kernel template declares, initialises and gets every buffer by looping over the plan,
- the simulator checks a launch's UB use against the plan's bound for the tile it ran
  (``codegen/sim/execute.py``): a template that allocates a buffer the plan does not know
  fails there, not on a device.

Sizes are linear in the tile: ``rt`` rows of ``ctp`` columns (``ctp`` rounded up so every
row starts on a UB block; a MIX kernel's base tile is ``baseM`` rows of ``baseN``).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphkernel.codegen.kernel_ir import Buffer, KernelIR, Linear

__all__ = ["Buffer", "BufferPlan", "Linear", "plan"]


@dataclass(frozen=True)
class BufferPlan:
    buffers: tuple[Buffer, ...]
    slack: Linear  # bytes counted beyond the buffers (see ``plan``)
    compute: str   # the C type the kernel's ``CT`` stands for

    def budget(self) -> Linear:
        total = self.slack
        for b in self.buffers:
            total = total + b.bound
        return total

    @property
    def scratch(self) -> tuple[Buffer, ...]:
        """The scratch buffers the code takes as LocalTensors (``Get``)."""
        return tuple(b for b in self.buffers if b.local)

    def describe(self) -> list[dict]:
        """The manifest's view: each buffer's role, position, depth and bytes per slot."""
        return [{"name": b.name, "role": b.role, "position": b.position, "depth": b.depth,
                 "type": self.compute if b.ctype == "CT" else b.ctype,
                 "bytes": b.init.replace("(CT)", f"({self.compute})")} for b in self.buffers]


def plan(ir: KernelIR, block_bytes: int) -> BufferPlan:
    """The buffers of the kernel lowered as ``ir``, in ``InitBuffer`` order. One block of
    slack beside them: the budget is solved at run time and a rounding the linear form does
    not see must not overflow the UB."""
    return BufferPlan(tuple(ir.buffers), Linear(fixed=block_bytes), ir.compute_type)


NO_BUFFERS = BufferPlan((), Linear(), "float")  # a cube kernel: C goes straight to GM
