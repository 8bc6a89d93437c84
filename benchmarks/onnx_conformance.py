"""Run ONNX's node conformance cases through graphkernel's importer and interpreter.

    python benchmarks/onnx_conformance.py [--filter SUBSTRING] [--verbose]

Prints `N passed, M failed, K skipped`, the failing cases with their reasons,
and (with --verbose) why each case was skipped. See docs/onnx-conformance.md.
"""

from __future__ import annotations

import argparse
import collections
import sys

from graphkernel.frontends.onnx import mapped_op_types
from graphkernel.frontends.onnx_conformance import run_conformance


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filter", help="only cases whose name contains this")
    ap.add_argument("--verbose", action="store_true", help="list skipped cases too")
    args = ap.parse_args()
    res = run_conformance(args.filter)
    mapped = [c for c in res.cases if not c.reason.startswith("not mapped")]
    print(f"importer maps {len(mapped_op_types())} ONNX op types; "
          f"{len(mapped)} of {len(res.cases)} cases use only mapped op types")
    for c in res.cases:
        if c.status == "failed":
            print(f"FAILED  {c.name}: {c.reason}")
    reasons = collections.Counter()
    for c in mapped:
        if c.status == "skipped":
            reasons[c.reason[:110]] += 1
            if args.verbose:
                print(f"skipped {c.name}: {c.reason}")
    if reasons:
        print("skipped among mapped cases, by reason:")
        for why, n in reasons.most_common():
            print(f"  {n:4d}  {why}")
    unmapped = sum(1 for c in res.cases if c.reason.startswith("not mapped"))
    print(f"({unmapped} cases use op types the importer does not map; they run as Opaque "
          "nodes and are not counted)")
    print(f"pass rate over mapped, runnable cases: {res.pass_rate:.1%}")
    print(res.summary())
    return 0 if res.count("failed") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
