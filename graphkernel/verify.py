"""Accuracy metrics and verdicts (see docs and the accuracy reference).

A result matches when ``|actual - expected| <= atol + rtol * |expected|``
elementwise, with torch.testing's per-dtype defaults, and no NaN/Inf appears
where the expected result has none. Each output's report also carries the
metrics Ascend's accuracy tools use: cosine similarity (passes above 0.99),
max absolute error (passes below 0.001), max relative error, and the share of
elements whose relative error is below 1/1000 and 5/1000.

Relative error is ``|a - e| / max(|e|, atol)`` so that elements whose expected
value is (near) zero do not explode the figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from graphkernel.ir import DType

# (rtol, atol) per dtype: the defaults of torch.testing.assert_close.
TOLERANCES: dict[DType, tuple[float, float]] = {
    DType.float16: (1e-3, 1e-5),
    DType.bfloat16: (1.6e-2, 1e-5),
    DType.float32: (1.3e-6, 1e-5),
    DType.float64: (1e-7, 1e-7),
}
COSINE_PASS = 0.99
MAX_ABS_PASS = 1e-3


def tolerance(dtype: DType | str) -> tuple[float, float]:
    """(rtol, atol) for a dtype; integers and bool compare exactly."""
    d = DType.parse(dtype)
    return TOLERANCES.get(d, (0.0, 0.0))


@dataclass
class OutputMetrics:
    name: str
    dtype: str
    shape: list[int]
    numel: int
    rtol: float
    atol: float
    mismatched: int
    max_abs_err: float
    max_abs_at: list[int] | None
    max_rel_err: float
    max_rel_at: list[int] | None
    cosine: float
    rmse: float
    ratio_rel_lt_1e3: float
    ratio_rel_lt_5e3: float
    new_nan_inf: int
    shape_mismatch: str = ""

    @property
    def passed(self) -> bool:
        return not self.shape_mismatch and self.mismatched == 0 and self.new_nan_inf == 0

    @property
    def cosine_pass(self) -> bool:
        return self.cosine > COSINE_PASS

    @property
    def max_abs_pass(self) -> bool:
        return self.max_abs_err < MAX_ABS_PASS

    def line(self) -> str:
        if self.shape_mismatch:
            return f"{self.name}: {self.shape_mismatch}"
        status = "ok" if self.passed else "MISMATCH"
        where = f" at {tuple(self.max_abs_at)}" if self.max_abs_at is not None else ""
        nan = f", {self.new_nan_inf} new NaN/Inf" if self.new_nan_inf else ""
        return (f"{self.name} [{self.dtype}{self.shape}]: {status}  "
                f"{self.mismatched}/{self.numel} outside rtol={self.rtol:g} atol={self.atol:g}; "
                f"max abs {self.max_abs_err:.3g}{where}; max rel {self.max_rel_err:.3g}; "
                f"cos {self.cosine:.6f}; rel<1e-3 {self.ratio_rel_lt_1e3:.2%}; "
                f"rel<5e-3 {self.ratio_rel_lt_5e3:.2%}{nan}")


@dataclass
class AccuracyReport:
    outputs: list[OutputMetrics] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def verdict(self) -> str:
        bad = [o for o in self.outputs if not o.passed]
        if not bad:
            worst = max(self.outputs, key=lambda o: o.max_abs_err, default=None)
            tail = (f" (worst: {worst.name} max abs {worst.max_abs_err:.3g}, "
                    f"cos {worst.cosine:.6f})") if worst else ""
            return f"MATCH: {len(self.outputs)} output(s) within tolerance{tail}"
        o = bad[0]
        if o.shape_mismatch:
            return f"MISMATCH: output '{o.name}': {o.shape_mismatch}"
        where = f" at {tuple(o.max_abs_at)}" if o.max_abs_at is not None else ""
        nan = f"; {o.new_nan_inf} new NaN/Inf" if o.new_nan_inf else ""
        more = f" (+{len(bad) - 1} more output(s))" if len(bad) > 1 else ""
        return (f"MISMATCH: output '{o.name}': {o.mismatched}/{o.numel} elements outside "
                f"rtol={o.rtol:g} atol={o.atol:g}; max abs {o.max_abs_err:.3g}{where}; "
                f"cos {o.cosine:.4f}{nan}{more}")

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "verdict": self.verdict(),
                "outputs": [asdict(o) | {"passed": o.passed} for o in self.outputs]}


def _as_f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def compare(actual: np.ndarray, expected: np.ndarray, dtype: DType | str | None = None,
            name: str = "output", rtol: float | None = None,
            atol: float | None = None) -> OutputMetrics:
    """Metrics of one output. ``dtype`` (default: expected's) selects the tolerances."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    d = DType.parse(dtype if dtype is not None else expected.dtype)
    rt, at = tolerance(d)
    rt = rt if rtol is None else rtol
    at = at if atol is None else atol
    base = dict(name=name, dtype=d.value, shape=list(expected.shape), numel=int(expected.size),
                rtol=rt, atol=at)
    if actual.shape != expected.shape:
        return OutputMetrics(**base, mismatched=int(expected.size), max_abs_err=float("inf"),
                             max_abs_at=None, max_rel_err=float("inf"), max_rel_at=None,
                             cosine=0.0, rmse=float("inf"), ratio_rel_lt_1e3=0.0,
                             ratio_rel_lt_5e3=0.0, new_nan_inf=0,
                             shape_mismatch=f"shape {list(actual.shape)} != expected "
                                            f"{list(expected.shape)}")
    a, e = _as_f64(actual), _as_f64(expected)
    with np.errstate(all="ignore"):
        e_bad = ~np.isfinite(e)
        a_bad = ~np.isfinite(a)
        new_nan_inf = int(np.sum(a_bad & ~e_bad))
        # non-finite expected values must be reproduced exactly (NaN matches NaN)
        special_ok = e_bad & ((np.isnan(a) & np.isnan(e)) | (a == e))
        finite = ~e_bad & ~a_bad
        diff = np.where(finite, np.abs(a - e), 0.0)
        ok = np.where(finite, diff <= at + rt * np.abs(e), special_ok)
        mismatched = int(np.sum(~ok))
        rel = np.where(finite, diff / np.maximum(np.abs(e), at if at > 0 else 1e-12), 0.0)
        n_fin = int(np.sum(finite))
        af, ef = a[finite], e[finite]
        na, ne = float(np.linalg.norm(af)), float(np.linalg.norm(ef))
        if na == 0.0 and ne == 0.0:
            cosine = 1.0
        elif na == 0.0 or ne == 0.0:
            cosine = 0.0
        else:
            cosine = float(np.dot(af, ef) / (na * ne))
        rmse = float(np.sqrt(np.mean((af - ef) ** 2))) if n_fin else 0.0
    if expected.size:
        i_abs = int(np.argmax(diff))
        i_rel = int(np.argmax(rel))
        max_abs, max_rel = float(diff.flat[i_abs]), float(rel.flat[i_rel])
        at_abs = [int(x) for x in np.unravel_index(i_abs, expected.shape)]
        at_rel = [int(x) for x in np.unravel_index(i_rel, expected.shape)]
    else:
        max_abs = max_rel = 0.0
        at_abs = at_rel = None
    denom = max(n_fin, 1)
    return OutputMetrics(
        **base, mismatched=mismatched, max_abs_err=max_abs, max_abs_at=at_abs,
        max_rel_err=max_rel, max_rel_at=at_rel, cosine=min(cosine, 1.0), rmse=rmse,
        ratio_rel_lt_1e3=float(np.sum(rel[finite] < 1e-3)) / denom if n_fin else 1.0,
        ratio_rel_lt_5e3=float(np.sum(rel[finite] < 5e-3)) / denom if n_fin else 1.0,
        new_nan_inf=new_nan_inf)


def compare_outputs(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                    names: Sequence[str] | None = None,
                    dtypes: Sequence[DType | str] | None = None) -> AccuracyReport:
    """Compare lists of outputs pairwise into one report."""
    if len(actual) != len(expected):
        raise ValueError(f"{len(actual)} actual outputs vs {len(expected)} expected")
    names = list(names) if names is not None else [f"output{i}" for i in range(len(actual))]
    rep = AccuracyReport()
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        dt = dtypes[i] if dtypes is not None else None
        rep.outputs.append(compare(a, e, dt, names[i]))
    return rep

