"""An einsum equation as graphkernel ops: transposes and views, a (batched) matrix product
for a contraction of two operands, else a broadcast product and a sum.

``einsum("bhld,bhsd->bhls", q, k)`` is the product of q [b h | l | d] and kᵀ [b h | d | s]
batched over b and h: the operands are put in [batch, kept, contracted] order, viewed as
[batch..., M, K] and [batch..., K, N], multiplied, and the result viewed back and transposed
into the output's order. An equation with nothing contracted between two operands (an outer
product) or with one operand is a broadcast product and a ReduceSum over the letters the
output drops. Letters are matched by size: a letter of size 1 against a larger one
(broadcasting) and a letter repeated in one operand (a diagonal) are refused, and the node
runs as it is.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

from graphkernel.ir import Value

Emit = Callable[[str, list[Value], dict[str, Any]], Value]


class EinsumUnsupported(ValueError):
    pass


def _terms(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' and the output's letters, an ellipsis spelled out in unused letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise EinsumUnsupported(f"equation {equation!r} names {len(terms)} operands, the node "
                                f"has {len(ranks)}")
    spare = [ch for ch in string.ascii_letters if ch not in eq]
    widths = [r - (len(t) - 3) for t, r in zip(terms, ranks, strict=True) if "..." in t]
    width = max(widths, default=0)
    ell = "".join(spare[:width])
    out_terms = []
    for t, r in zip(terms, ranks, strict=True):
        if "..." in t:
            k = r - (len(t) - 3)
            t = t.replace("...", ell[width - k:] if k else "")
        if len(t) != r or (t and not t.isalpha()):
            raise EinsumUnsupported(f"operand letters {t!r} do not match its rank {r}")
        if len(set(t)) != len(t):
            raise EinsumUnsupported(f"a repeated index in {t!r} (a diagonal)")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:  # implicit output: the ellipsis, then the letters used once, in order
        counts = {ch: sum(t.count(ch) for t in out_terms) for ch in set("".join(out_terms))}
        out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
    if not out.isalpha() and out:
        raise EinsumUnsupported(f"output letters {out!r}")
    if any(ch not in "".join(out_terms) for ch in out) or len(set(out)) != len(out):
        raise EinsumUnsupported(f"output letters {out!r} must each come from an operand once")
    return out_terms, out


def _sizes(terms: list[str], values: list[Value]) -> dict[str, Any]:
    sizes: dict[str, Any] = {}
    for t, v in zip(terms, values, strict=True):
        for ch, d in zip(t, v.shape, strict=True):
            if sizes.setdefault(ch, d) != d:
                raise EinsumUnsupported(f"index {ch!r} has sizes {sizes[ch]} and {d} "
                                        "(broadcasting is not modeled)")
    return sizes


def _transpose(emit: Emit, v: Value, have: str, want: str) -> Value:
    if have == want:
        return v
    return emit("Transpose", [v], {"perm": [have.index(ch) for ch in want]})


def _reshape(emit: Emit, v: Value, shape: list) -> Value:
    if list(v.shape) == list(shape):
        return v
    return emit("Reshape", [v], {"shape": list(shape)})


def _product(shape: list) -> Any:
    out = 1
    for d in shape:
        if not isinstance(d, int):
            raise EinsumUnsupported("a symbolic size inside a merged axis")
        out *= d
    return out


def lower_einsum(equation: str, values: list[Value], emit: Emit) -> Value:
    """The ops computing ``einsum(equation, *values)`` (one or two operands)."""
    if len(values) not in (1, 2):
        raise EinsumUnsupported(f"{len(values)} operands (1 or 2 are modeled)")
    terms, out = _terms(equation, [v.type.rank for v in values])
    sizes = _sizes(terms, values)
    # a letter only one operand has and the output drops is summed out first
    for i, t in enumerate(terms):
        others = "".join(terms[:i] + terms[i + 1:]) + out
        drop = [k for k, ch in enumerate(t) if ch not in others]
        if drop:
            values[i] = emit("ReduceSum", [values[i]], {"axis": drop, "keep_dims": False})
            terms[i] = "".join(ch for ch in t if ch in others)
    if len(values) == 2:
        a, b = terms
        contracted = [ch for ch in a if ch in b and ch not in out]
        if contracted:
            return _matmul(emit, values, a, b, out, contracted, sizes)
    return _broadcast(emit, values, terms, out, sizes)


def _matmul(emit: Emit, values: list[Value], a: str, b: str, out: str, contracted: list[str],
            sizes: dict[str, Any]) -> Value:
    batch = [ch for ch in out if ch in a and ch in b]
    m = [ch for ch in a if ch not in b]
    n = [ch for ch in b if ch not in a]
    k = contracted
    bs = [sizes[ch] for ch in batch]
    x = _transpose(emit, values[0], a, "".join(batch + m + k))
    x = _reshape(emit, x, bs + [_product([sizes[c] for c in m]), _product([sizes[c] for c in k])])
    y = _transpose(emit, values[1], b, "".join(batch + k + n))
    y = _reshape(emit, y, bs + [_product([sizes[c] for c in k]), _product([sizes[c] for c in n])])
    z = emit("BatchMatMul" if batch else "MatMul", [x, y], {})
    z = _reshape(emit, z, bs + [sizes[c] for c in m] + [sizes[c] for c in n])
    return _transpose(emit, z, "".join(batch + m + n), out)


def _broadcast(emit: Emit, values: list[Value], terms: list[str], out: str,
               sizes: dict[str, Any]) -> Value:
    order = out + "".join(dict.fromkeys(ch for t in terms for ch in t if ch not in out))
    lined = []
    for v, t in zip(values, terms, strict=True):
        mine = "".join(ch for ch in order if ch in t)
        v = _transpose(emit, v, t, mine)
        lined.append(_reshape(emit, v, [sizes[ch] if ch in t else 1 for ch in order]))
    y = lined[0] if len(lined) == 1 else emit("Mul", lined, {})
    summed = [i for i, ch in enumerate(order) if ch not in out]
    if summed:
        y = emit("ReduceSum", [y], {"axis": summed, "keep_dims": False})
    return _reshape(emit, y, [sizes[ch] for ch in out])
