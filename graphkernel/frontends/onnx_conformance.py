"""Run ONNX's own node conformance cases (shipped in the onnx package) through the
importer and the interpreter.

A case counts when every node in it has an importer mapping. It passes when the
import produced no Opaque node and every output matches the case's expected
output (dtype, shape, and values within the case's own rtol/atol). Cases that use
element types graphkernel does not model, or that the importer declines (an
Opaque fallback), are skipped with the reason.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from graphkernel.errors import GraphKernelError
from graphkernel.interpreter import Interpreter
from graphkernel.ir import DType


@dataclass
class CaseResult:
    name: str
    op_types: list[str]
    status: str  # passed | failed | skipped
    reason: str = ""


@dataclass
class ConformanceResult:
    cases: list[CaseResult] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for c in self.cases if c.status == status)

    @property
    def pass_rate(self) -> float:
        p, f = self.count("passed"), self.count("failed")
        return p / (p + f) if p + f else 0.0

    def summary(self) -> str:
        return (f"{self.count('passed')} passed, {self.count('failed')} failed, "
                f"{self.count('skipped')} skipped")


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> str:
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)} != expected {list(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    if expected.dtype.kind in "iub":
        bad = int(np.sum(actual != expected))
        return f"{bad} elements differ" if bad else ""
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    np.seterr(invalid="ignore")
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(e) & (a == e)
    ok = both_nan | same_inf | (np.abs(a - e) <= atol + rtol * np.abs(e))
    bad = int(np.sum(~ok))
    if bad:
        diff = np.abs(a - e)
        diff[ok] = 0
        return f"{bad}/{a.size} elements differ, max abs diff {np.nanmax(diff):.3g}"
    return ""


def run_case(case) -> CaseResult:
    from graphkernel.frontends.onnx import (
        _ONNX_DTYPES,
        HANDLERS,
        ImportNote,
        import_onnx,
        static_input_names,
    )

    model = case.model
    op_types = sorted({n.op_type for n in model.graph.node})
    res = CaseResult(case.name, op_types, "skipped")
    unmapped = [t for t in op_types if t not in HANDLERS]
    if unmapped or any(n.domain not in ("", "ai.onnx") for n in model.graph.node):
        res.reason = "not mapped: " + ", ".join(unmapped)
        return res
    for vi in list(model.graph.input) + list(model.graph.output):
        if not vi.type.HasField("tensor_type"):
            res.reason = f"non-tensor value {vi.name!r} ({vi.type.WhichOneof('value')})"
            return res
        if vi.type.tensor_type.elem_type not in _ONNX_DTYPES:
            import onnx

            dt = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
            res.reason = f"element type {dt} is not modeled"
            return res
    input_names = [vi.name for vi in model.graph.input]
    static = set(static_input_names(model))
    from onnx import numpy_helper

    def arr(x):
        return numpy_helper.to_array(x) if hasattr(x, "SerializeToString") else np.asarray(x)

    for inputs, expected in case.data_sets:
        feeds = {k: arr(x) for k, x in zip(input_names, inputs, strict=False)}
        expected = [arr(x) for x in expected]
        notes: list[ImportNote] = []
        try:
            g = import_onnx(model, specialize={k: feeds[k] for k in static if k in feeds},
                            notes=notes)
        except GraphKernelError as e:
            if notes:  # a declined node whose output type ONNX cannot infer
                res.reason = "Opaque fallback: " + "; ".join(f"{n.op_type}: {n.reason}"
                                                             for n in notes)
                return res
            res.status, res.reason = "failed", f"import: {e}"
            return res
        if notes:
            res.reason = "Opaque fallback: " + "; ".join(f"{n.op_type}: {n.reason}" for n in notes)
            return res
        run_feeds = {v.name: feeds[v.name] for v in g.inputs}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs = Interpreter(g).run(run_feeds)
        except GraphKernelError as e:
            res.status, res.reason = "failed", f"run: {e}"
            return res
        for v, a, e in zip(g.outputs, outs, expected, strict=False):
            e = np.asarray(e)
            if e.dtype == DType.bfloat16.np or e.dtype.kind == "V":
                e = e.astype(np.float32)
                a = a.astype(np.float32)
            why = _close(a, e, case.rtol, case.atol)
            if why:
                res.status, res.reason = "failed", f"output {v.name!r}: {why}"
                return res
    res.status, res.reason = "passed", ""
    return res


def run_conformance(name_filter: str | None = None) -> ConformanceResult:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    out = ConformanceResult()
    for case in sorted(cases, key=lambda c: c.name):
        if name_filter and name_filter not in case.name:
            continue
        out.cases.append(run_case(case))
    return out
