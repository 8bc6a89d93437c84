"""The smallest training case of scaled_dot_product_attention: three nn.Linear projections
(hidden 64, 4 heads of 16) feeding ``F.scaled_dot_product_attention``, with and without
``is_causal``; one step of ``out.pow(2).mean().backward()`` eagerly and through
``torch.compile(backend="graphkernel")`` at opt_level 0 and 2.

    python benchmarks/attention_gradients.py

A row prints the largest gradient error over the six parameters against eager, next to the
largest gradient, and the fused-attention launches of the forward and backward graphs.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import logging

    import torch
    import torch.nn.functional as F

    import graphkernel.torch as gt

    warnings.simplefilter("ignore")
    logging.getLogger("graphkernel.fx").setLevel(logging.ERROR)

    class Attend(torch.nn.Module):
        def __init__(self, causal: bool):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(64, 64) for _ in range(3))
            self.causal = causal

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = (m(x).view(b, n, 4, 16).transpose(1, 2) for m in (self.q, self.k, self.v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    print(f"{'is_causal':<9} {'opt_level':>9} | {'max |grad error|':>16} {'max |grad|':>10} | "
          "fused attention fwd/bwd")
    worst = 0.0
    for causal in (False, True):
        for level in (0, 2):
            torch.manual_seed(0)
            torch._dynamo.reset()
            gt.reset_stats()
            model = Attend(causal).train()
            twin = copy.deepcopy(model)
            x = torch.randn(2, 16, 64)
            model(x).pow(2).mean().backward()
            compiled = torch.compile(twin, backend="graphkernel",
                                     options={"flags": f"--opt_level={level}"})
            compiled(x).pow(2).mean().backward()
            err = max(float((a.grad - b.grad).abs().max())
                      for a, b in zip(model.parameters(), twin.parameters(), strict=True))
            big = max(float(a.grad.abs().max()) for a in model.parameters())
            worst = max(worst, err / big)
            ext = [g["launches"]["extern"] for g in gt.stats()["per_graph"]]
            print(f"{causal!s:<9} {level:>9} | {err:>16.3g} {big:>10.3g} | "
                  + "/".join(map(str, ext)))
    print(f"worst error relative to the largest gradient: {worst:.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
