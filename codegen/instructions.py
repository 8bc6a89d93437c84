"""The instruction table: how each IR op inside a kernel becomes Ascend C, as data.

One ``Instruction`` per op the lowering handles (every op a registered op). ``form`` names
the lowering rule (``codegen/lower.py``'s ``RULES``: one function per form, checked complete);
the other fields are what that rule needs:
the Ascend C call, the operand count, the C++ expression used when every operand is a scalar,
the scratch a call needs, the element types it takes. The schedule accepts exactly the ops of
this table (besides views, slices, Concat and BroadcastTo's aliases), and the op groups other
modules use (``REDUCE_OPS``, ``MASK_OPS``, ...) are read off it.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphkernel.ir import DType

FLOATS = frozenset({DType.float32, DType.float16, DType.bfloat16})
BOOL = frozenset({DType.bool})
BITS = DType.int32   # integer data: carried as raw 4-byte words, only through bitwise ops

# the lowering rules: plain calls over one layout, and the shaped ones
FORMS = ("unary", "binary", "reduce", "broadcast", "round", "cast", "pow", "compare",
         "classify", "logical", "bitwise", "select", "sign", "scan")


@dataclass(frozen=True)
class Instruction:
    op: str
    form: str                    # the lowering rule (one of FORMS)
    api: str | None = None       # the Ascend C call; None: composed by the form
    arity: int = 1
    scalar: str | None = None    # C++ on scalar operands: {0}, {1} operands, {t} result type
    scratch: str | None = None   # "ht": the math library's scratch tile; "hh": 16-bit scratch
    dtypes: frozenset[DType] = FLOATS  # element types of the operands (as stored in GM)
    mode: str | None = None      # the call's mode argument: RoundMode, CMPMODE
    scalar_api: str | None = None  # the tensor-with-scalar call (commutative ops)
    row_op: str | None = None    # the kernel template's op code for its whole-row forms
    identity: str | None = None  # a reduction's start value (C++), for accumulation
    accumulate: str | None = None  # a reduction's combining call over the rows
    fold: str | None = None      # a reduction's scalar combination of totals l and r
    mask: bool = False           # makes or reads bit masks: whole-repeat tiles
    in_place: bool = True        # the result may take a dead operand's buffer (False: the
    #                              form reads an operand after writing the result)

    @property
    def makes_mask(self) -> bool:
        """The result is a bit mask (a ``wm`` buffer), read by Select."""
        return self.form in ("compare", "classify")


def _unary(op: str, api: str | None, scalar: str | None, scratch: str | None = None
           ) -> Instruction:
    return Instruction(op, "unary", api, 1, scalar, scratch)


def _math(op: str, scalar: str | None = None) -> Instruction:
    """A call of the high-level math library (its scratch is ``ht``)."""
    return _unary(op, op, scalar or f"std::{op.lower()}({{0}})", "ht")


def _binary(op: str, api: str, scalar: str, scalar_api: str | None = None,
            row_op: str | None = None) -> Instruction:
    return Instruction(op, "binary", api, 2, scalar, scalar_api=scalar_api, row_op=row_op)


def _reduce(op: str, api: str | None, accumulate: str, identity: str, fold: str,
            row_op: str | None) -> Instruction:
    return Instruction(op, "reduce", api, 1, row_op=row_op, identity=identity,
                       accumulate=accumulate, fold=fold)


def _round(op: str, mode: str, fn: str) -> Instruction:
    """A Cast of the compute type to itself, to an integral value (fp16 kernels round
    through fp32: the vector unit has no half -> half Cast)."""
    return Instruction(op, "round", "Cast", 1, f"std::{fn}({{0}})", mode=mode)


def _compare(op: str, mode: str) -> Instruction:
    """A bit mask, consumed by Select."""
    return Instruction(op, "compare", "Compare", 2, mode=mode, mask=True)


TABLE: tuple[Instruction, ...] = (
    _unary("Exp", "Exp", "std::exp({0})"),
    _unary("Log", "Ln", "std::log({0})"),
    _unary("Abs", "Abs", "std::fabs({0})"),
    _unary("Sqrt", "Sqrt", "std::sqrt({0})"),
    _unary("Rsqrt", "Rsqrt", "(1.0f / std::sqrt({0}))"),
    _unary("Reciprocal", "Reciprocal", "(1.0f / {0})"),
    _unary("Neg", None, "(-{0})"),  # Muls by -1
    _math("Erf"), _math("Erfc"), _math("Tanh"), _math("Sin"), _math("Cos"), _math("Tan"),
    _math("Asin"), _math("Acos"), _math("Atan"),
    _math("Sigmoid", "(1.0f / (1.0f + std::exp(-{0})))"),
    _binary("Add", "Add", "({0} + {1})", "Adds", "OP_ADD"),
    _binary("Sub", "Sub", "({0} - {1})", None, "OP_SUB"),
    _binary("Mul", "Mul", "({0} * {1})", "Muls", "OP_MUL"),
    _binary("Div", "Div", "({0} / {1})", None, "OP_DIV"),
    _binary("Maximum", "Max", "std::fmax({0}, {1})", "Maxs", "OP_MAX"),
    _binary("Minimum", "Min", "std::fmin({0}, {1})", "Mins", "OP_MIN"),
    Instruction("Pow", "pow", "Power", 2, "std::pow({0}, {1})", scratch="ht", in_place=False),
    _reduce("ReduceSum", "ReduceSum", "Add", "0.0f", "l + r", "OP_ADD"),
    _reduce("ReduceMax", "ReduceMax", "Max", "-INFINITY", "(std::isnan(l) || l > r) ? l : r",
            "OP_MAX"),
    _reduce("ReduceMin", "ReduceMin", "Min", "INFINITY", "(std::isnan(l) || l < r) ? l : r",
            "OP_MIN"),
    # no instruction: a product along the row, element by element, by the scalar unit
    _reduce("ReduceProd", None, "Mul", "1.0f", "l * r", None),
    Instruction("BroadcastTo", "broadcast", scalar="{0}"),
    _round("Floor", "CAST_FLOOR", "floor"), _round("Ceil", "CAST_CEIL", "ceil"),
    _round("Trunc", "CAST_TRUNC", "trunc"), _round("Round", "CAST_RINT", "nearbyint"),
    # to fp16/bf16 and back: the rounding the graph asks for
    Instruction("Cast", "cast", "Cast", 1, "(float)({t})({0})", scratch="hh"),
    _compare("Greater", "GT"), _compare("GreaterEqual", "GE"), _compare("Less", "LT"),
    _compare("LessEqual", "LE"), _compare("Equal", "EQ"), _compare("NotEqual", "NE"),
    # NaN is the one value unequal to itself: one Compare, read as a mask by what follows
    Instruction("IsNan", "classify", "Compare", 1, mode="NE", mask=True),
    Instruction("IsInf", "classify", "Compare", 1, mode="EQ", mask=True),
    Instruction("IsFinite", "classify", "Compare", 1, mode="EQ", mask=True),
    # bools held as fp32 0/1: and = product, or = max, not = 1 - x
    Instruction("LogicalAnd", "logical", "Mul", 2, dtypes=BOOL),
    Instruction("LogicalOr", "logical", "Max", 2, dtypes=BOOL),
    Instruction("LogicalNot", "logical", None, 1, dtypes=BOOL),
    # on bools as LogicalAnd/LogicalOr; on int32 words the And/Or calls over the bits
    Instruction("BitwiseAnd", "bitwise", "And", 2, dtypes=BOOL | {BITS}),
    Instruction("BitwiseOr", "bitwise", "Or", 2, dtypes=BOOL | {BITS}),
    Instruction("Select", "select", "Select", 3, dtypes=FLOATS | BOOL, mask=True),
    # 1 where x > 0, -1 where x < 0, else x itself (0, -0, NaN)
    Instruction("Sign", "sign", "Select", 1, mask=True, in_place=False),
    # a running combination down the rows of a tile, carried across tiles in a row of the
    # kernel (the rows are the scanned axis: a kernel over the rows, codegen/vector/schedule.py)
    Instruction("Scan", "scan", "ScanRows", 2, in_place=False),
)
# a Scan's combine rule -> (the kernel template's op code, or None for the linear recurrence's own
# helper; the running value's start: the rule's identity)
SCAN_RULES: dict[str, tuple[str | None, str]] = {
    "add": ("SCAN_ADD", "0.0f"), "mul": ("SCAN_MUL", "1.0f"), "max": ("SCAN_MAX", "-INFINITY"),
    "min": ("SCAN_MIN", "INFINITY"), "linear": (None, "0.0f")}
INSTRUCTIONS: dict[str, Instruction] = {i.op: i for i in TABLE}


def ops(*forms: str) -> frozenset[str]:
    """The ops lowered by the given forms."""
    return frozenset(i.op for i in TABLE if i.form in forms)


REDUCE_OPS = ops("reduce")
MASK_OPS = frozenset(i.op for i in TABLE if i.mask)  # whole repeats of elements per tile
BITWISE_OPS = ops("bitwise")
SCAN_OPS = ops("scan")
