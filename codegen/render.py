"""What rendering a vector kernel and a cube kernel share: the rendered record, the templates'
environment, the host code's symbols (each symbolic dim as a C expression over the actual
shapes) and the target's facts the templates write as numbers."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from graphkernel import symbolic
from graphkernel.codegen.buffers import BufferPlan
from graphkernel.codegen.kernel_ir import KernelIR
from graphkernel.codegen.refusal import Unsupported
from graphkernel.codegen.targets import Target
from graphkernel.codegen.vector.schedule import Schedule
from graphkernel.ir import Dim, DType, Value

TEMPLATES = Path(__file__).resolve().parent / "templates"


@functools.cache
def env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False,
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


@dataclass
class Rendered:
    schedule: Schedule  # or a MatmulSchedule (a cube kernel: no lowering)
    ir: KernelIR | None  # the kernel IR (None: a cube kernel, lowered by no engine)
    files: dict[str, str]         # file name -> text
    manifest: dict[str, Any]
    plan: BufferPlan              # the kernel's UB buffers
    variant: Rendered | None = None  # the rows-in-chunks variant (tiling key 1), if any
    members: list[Rendered] | None = None  # a product group's products (codegen/cube/group.py)

    @property
    def name(self) -> str:
        return self.schedule.name


def shape_refs(s: Schedule) -> dict[str, str]:
    """Each symbol -> the C expression of it from the host's ``shapes`` array: every input's
    dims, then every output's (the framework knows both before a launch). A symbol is a dim
    of its own, or a dim's quotient by its other factors once those are known
    (``197*s0`` gives s0; ``s0*s1`` gives s1 once s0 is known)."""
    dims: list[tuple[int, tuple[str, ...], str]] = []
    off = 0
    for io in [*s.inputs, *s.outputs]:
        for a, d in enumerate(io.shape):
            if isinstance(d, str):
                coef, syms = symbolic.parse_dim(d)
                dims.append((coef, syms, f"(uint64_t)shapes[{off + a}]"))
        off += len(io.shape)
    # a product of symbols is also read whole where an input or output has it as a dim
    refs: dict[str, str] = {}
    for coef, syms, ref in dims:
        if coef == 1 and len(syms) > 1:
            refs.setdefault(symbolic.make_dim(1, syms), ref)
    _solve(dims, refs)
    # a multiple of a product whose symbols stay unknown (``2*s0*s1``, tokens times the
    # experts each picks, where no dim gives s0 or s1 alone): the product is that dim
    # divided by its coefficient (exact: the dim is that multiple)
    more = False
    for coef, syms, ref in dims:
        whole = symbolic.make_dim(1, syms)
        if len(syms) > 1 and whole not in refs and any(_c_symbol(x, refs) is None
                                                       for x in syms):
            refs[whole] = f"({ref} / {coef}ull)"
            more = True
    if more:
        _solve(dims, refs)
    return refs


def _solve(dims: list[tuple[int, tuple[str, ...], str]], refs: dict[str, str]) -> None:
    """Add to ``refs`` every symbol a dim gives once its other factors are known."""
    progress = True
    while progress:
        progress = False
        for coef, syms, ref in dims:
            free = [x for x in syms if _c_symbol(x, refs) is None]
            if len(free) != 1 or syms.count(free[0]) != 1:
                continue
            known = [_c_symbol(x, refs) for x in syms if x != free[0]]
            divisor = " * ".join([f"{coef}ull", *known]) if coef != 1 or known else None
            refs[free[0]] = f"({ref} / ({divisor}))" if divisor else ref
            progress = True


def shape_doc(s: Schedule) -> str:
    """What the ``shapes`` array holds, for the tiling function's comment."""
    return ", ".join([f"input {io.index}: {symbolic.format_shape(io.shape)}" for io in s.inputs]
                     + [f"output {io.index}: {symbolic.format_shape(io.shape)}"
                        for io in s.outputs])


def c_dim(d: Dim, refs: dict[str, str]) -> str:
    coef, syms = symbolic.parse_dim(d)
    whole = symbolic.make_dim(1, syms)
    if len(syms) > 1 and isinstance(whole, str) and whole in refs:
        return f"{coef}ull * {refs[whole]}"
    parts = [f"{coef}ull"]
    for sym in syms:
        ref = _c_symbol(sym, refs)
        if ref is None:
            raise Unsupported(f"symbol {symbolic.pretty(sym)} is not a whole dim of any input "
                              "nor computed from one (the host tiling reads extents from the "
                              "input shapes)")
        parts.append(ref)
    return " * ".join(parts)


def _c_symbol(sym: str, refs: dict[str, str]) -> str | None:
    """The C expression of a symbol: an input dim that is it, or one computed from an input
    dim of the same base. ``floor((x + a)/d)`` follows from ``y = floor((x + a2)/d2)`` when
    d2 divides d and a - a2: it is ``floor((y + (a - a2)/d2) / (d/d2))`` (symbolic.py);
    the plain base is ``(x, 0, 1)``."""
    if sym in refs:
        return refs[sym]
    base, add, div = symbolic.derived(sym) or (sym, 0, 1)
    for other, ref in refs.items():
        obase, oadd, odiv = symbolic.derived(other) or (other, 0, 1)
        if obase != base or div % odiv or (add - oadd) % odiv:
            continue
        # sizes are never negative here: C's truncating division is the floor
        return (f"(uint64_t)(((int64_t){ref} + ({(add - oadd) // odiv}ll)) / "
                f"{div // odiv}ll)")
    return None


def target_facts(tg: Target) -> dict[str, int]:
    """The target's facts the templates write into the code as numbers (constants)."""
    return {"blk": tg.block_bytes, "rep": tg.repeat_bytes, "bpr": tg.blocks_per_repeat,
            "mr": tg.max_repeats, "brcb_reps": _brcb_repeats(tg)}


def _brcb_repeats(tg: Target) -> int:
    """Repeats per Brcb instruction: at most max_repeats, and few enough that the next
    instruction's first row still starts a UB block for a 16-bit compute type (Brcb spreads
    one element per block, blocks_per_repeat elements per repeat)."""
    rows_per_block = tg.block_elems(2)
    k = math.lcm(tg.blocks_per_repeat, rows_per_block) // tg.blocks_per_repeat
    return tg.max_repeats // k * k


@dataclass
class ValueIO:
    """A kernel input or output of a kernel form that keeps a whole value per role: its
    position, the subgraph value and its role (``kind``: what the form's schedule names it)."""

    index: int
    value: Value
    kind: str

    @property
    def dtype(self) -> DType:
        return self.value.dtype

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape)


def io_entry(io) -> dict[str, Any]:
    """A kernel input or output as the manifest lists it."""
    return {"name": io.value.name, "dtype": str(io.dtype), "shape": list(io.shape),
            "layout": io.kind}
