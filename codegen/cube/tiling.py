"""Matmul tiling: the ``TCubeTiling`` of a matrix product on the target's cube cores.

A product ``C[M, N] = A[M, K] · B[K, N]`` (per batch element) is split over cube cores in
blocks of ``singleCoreM × singleCoreN`` (K is never split); a core walks its block in base
tiles of ``baseM × baseN``, each accumulated over K in steps of ``baseK`` in L0C (fp32).
Constraints (the reference's, checked again by the simulator):

- ``baseM``, ``baseN`` multiples of the fractal (16), ``baseK`` of the fractal and of
  ``cube_k_bytes`` (int8: 32);
- ``baseM·baseK·sizeof(A) ≤ L0A / 2`` and ``baseK·baseN·sizeof(B) ≤ L0B / 2`` (double
  buffered), ``baseM·baseN·4 ≤ L0C``;
- ``depthA1·baseM·baseK·sizeof(A) + depthB1·baseK·baseN·sizeof(B) (+ a bias row) ≤ L1``;
- the C tile moved to UB (``transLength`` bytes) plus the epilogue's UB bytes ≤ UB.

An epilogue that reduces along N (a LayerNorm, RMSNorm or softmax after the product) needs
whole rows in a base tile: ``whole_rows`` keeps N in one core (``coresN = 1``, the cores
split M only) and takes ``baseN`` = N rounded up to the fractal (past the 256 the other
tilings stop at). L0B and L0C then bound the row: with ``baseK`` at least the fractal,
``16·baseN·sizeof(B) ≤ L0B / 2`` (N ≤ 1024 for fp16, 512 for fp32 on a 64 KiB L0B) and
``16·baseN·4 ≤ L0C``; a longer row has no tiling (the kernel is then split).

GM traffic. Splitting the problem ``cores_m × cores_n`` ways reads A ``cores_n`` times and
B ``cores_m`` times (``M·K·cores_n + K·N·cores_m`` elements: ``split_bytes``). Inside a
core, L1 holds ``depthA1`` base tiles of A and ``depthB1`` of B: a *panel* is one base tile
row of A (``baseM × K``) or column of B (``K × baseN``). With ``iterateOrder`` 0 the core
walks M inside N (for each N tile, every M tile): the B panel stays in L1 across the inner
loop, the A panels are read once when all of the core's fit L1, else once per N tile; order
1 is the mirror image. A panel that does not fit L1 at all is streamed in K steps and read
once per base tile. ``gm_bytes`` counts exactly that (the simulator's Matmul counts its
loads by the same rule). The split and the base tiles minimise modeled time
(``max(traffic / HBM, flops / cube throughput)`` over the cores used, a core drawing at
most ``1 / aic_cores`` of the HBM bandwidth; times within 1 us count as equal), then
traffic, then the most cores busy, then the largest base tile.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from graphkernel.codegen.targets import Target
from graphkernel.errors import CodegenError

TIME_STEPS = 1  # the search's resolution of modeled time: 1 us (half a launch's overhead)


class NoTiling(CodegenError):
    """No base tile satisfies the target's buffer limits (MatmulApiTiling's -1)."""


@dataclass(frozen=True)
class CubeTiling:
    """The fields a Matmul kernel reads (TCubeTiling's names), plus the batch split and the
    traffic model's figures."""

    usedCoreNum: int
    M: int
    N: int
    Ka: int
    Kb: int
    singleCoreM: int
    singleCoreN: int
    singleCoreK: int
    baseM: int
    baseN: int
    baseK: int
    depthA1: int      # A base tiles L1 holds
    depthB1: int      # B base tiles L1 holds
    stepM: int        # A base tiles (along M) per L1 load
    stepN: int        # B base tiles (along N) per L1 load
    stepKa: int       # A base tiles along K per L1 load
    stepKb: int       # B base tiles along K per L1 load
    isBias: int
    iterateOrder: int  # 0: M inside N (B panel resident); 1: N inside M (A panel resident)
    transLength: int  # UB bytes of one C base tile
    batch: int        # batch elements (1 for MatMul); blocks are batch x M blocks x N blocks
    coresM: int
    coresN: int
    gm_bytes: int     # modeled GM bytes read of A, B and the bias over all cores (in-core
    #                   re-reads included)
    split_bytes: int  # the split's reads alone: (M·K·coresN + K·N·coresM)·size, per batch
    modeled_us: float

    @property
    def blocks(self) -> int:
        """Work blocks: batch × M blocks × N blocks (cores take them round robin)."""
        return self.batch * self.coresM * self.coresN

    def fields(self) -> dict[str, int]:
        """The integer fields, in order (the tiling struct's layout)."""
        return {k: v for k, v in asdict(self).items() if isinstance(v, int)}


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_rows(total: int, parts: int, align: int) -> int:
    """One core's share of ``total`` split ``parts`` ways, a multiple of ``align`` (so
    every core but the last starts on a fractal boundary)."""
    return min(total, _up(_cdiv(total, parts), align))


@dataclass(frozen=True)
class _Shape:
    M: int
    N: int
    K: int
    batch: int
    a: int      # itemsize of A
    b: int      # itemsize of B
    c: int      # itemsize of C in UB
    bias: bool
    u: int      # UB bytes per C tile element (the C tile and the epilogue's tiles)


def panel_reads(sm: int, sn: int, K: int, bm: int, bn: int, bk: int, depth_a: int,
                depth_b: int, order: int, a: int, b: int, bias: bool) -> int:
    """GM bytes one core reads for a ``sm × sn`` block (see the module docstring)."""
    tm, tn, kt = _cdiv(sm, bm), _cdiv(sn, bn), _cdiv(K, bk)
    cap_a, cap_b = depth_a // kt, depth_b // kt  # whole panels L1 holds
    a_once, b_once = sm * K * a, sn * K * b
    if order == 0:  # N outer, M inner
        rb = b_once if cap_b >= 1 else tm * b_once
        ra = a_once if cap_a >= tm and cap_b >= 1 else tn * a_once
    else:
        ra = a_once if cap_a >= 1 else tn * a_once
        rb = b_once if cap_b >= tn and cap_a >= 1 else tm * b_once
    rbias = rb // (K * b) * 4 if bias else 0  # the fp32 bias row comes with each B panel
    return ra + rb + rbias


def _all_reads(sh: _Shape, sm: int, sn: int, bm: int, bn: int, bk: int, depth_a: int,
               depth_b: int, order: int) -> int:
    """GM bytes over all blocks of one batch element: the full blocks and the tail blocks."""
    rows = [(sm, sh.M // sm)] + ([(sh.M % sm, 1)] if sh.M % sm else [])
    cols = [(sn, sh.N // sn)] + ([(sh.N % sn, 1)] if sh.N % sn else [])
    return sum(panel_reads(r, c, sh.K, bm, bn, bk, depth_a, depth_b, order, sh.a, sh.b,
                           sh.bias) * nr * nc for r, nr in rows for c, nc in cols)


def _sizes(extent: int, f: int) -> list[int]:
    """Base sizes worth trying along an axis of ``extent``: powers of two times the fractal
    up to 256, and the extent rounded up to the fractal when smaller."""
    top = min(_up(extent, f), 256)
    out = {f << i for i in range(8) if f << i <= top}
    return sorted(out | {top})


def _base_candidates(sh: _Shape, sm: int, sn: int, spec: Target, whole_rows: bool = False
                     ) -> list[tuple[int, int, int]]:
    f = spec.cube_fractal
    ka = spec.cube_k_align(min(sh.a, sh.b))
    out = []
    for bm in _sizes(sm, f):
        for bn in [_up(sn, f)] if whole_rows else _sizes(sn, f):
            if bm * bn * 4 > spec.l0c_bytes or bm * bn * sh.u > spec.ub_bytes:
                continue
            kmax = min(spec.l0a_bytes // 2 // (bm * sh.a), spec.l0b_bytes // 2 // (bn * sh.b))
            bk = min(kmax // ka * ka, _up(sh.K, ka))
            if bk >= ka:
                out.append((bm, bn, bk))
    return out


def tile(M: int, N: int, K: int, a_bytes: int, b_bytes: int, c_bytes: int, spec: Target,
         batch: int = 1, bias: bool = False, ub_reserved: int = 0,
         ub_per_elem: int | None = None, whole_rows: bool = False) -> CubeTiling:
    """The tiling of a ``[batch ×] M × N × K`` product with operands of ``a_bytes`` /
    ``b_bytes`` per element and C of ``c_bytes`` per element; ``ub_per_elem``: UB bytes per
    C tile element (a MIX kernel's C tile and epilogue tiles; default ``c_bytes``),
    ``ub_reserved``: UB bytes the epilogue needs besides; ``whole_rows``: a base tile holds
    whole rows (see the module docstring). Raises NoTiling when nothing fits."""
    for what, v in (("M", M), ("N", N), ("K", K), ("batch", batch)):
        if v < 1:
            raise NoTiling(f"a matmul of {what} = {v}: every extent must be at least 1")
    per = ub_per_elem or c_bytes
    sh = _Shape(M, N, K, batch, a_bytes, b_bytes, c_bytes, bias, per)
    f = spec.cube_fractal
    ub = spec.ub_bytes - ub_reserved
    flops_per_us = spec.cube_tflops * 1e6 / spec.aic_cores  # one cube core
    fp32 = 2 if max(a_bytes, b_bytes) >= 4 else 1  # fp32 operands: half the fp16 rate
    found: list[tuple] = []  # (tie-break key, choice fields ..., modeled us)
    mblocks, nblocks = _cdiv(M, f), _cdiv(N, f)
    for cm in range(1, min(spec.aic_cores, mblocks) + 1):
        for cn in range(1, 1 + (1 if whole_rows else min(spec.aic_cores // cm, nblocks))):
            sm, sn = block_rows(M, cm, f), block_rows(N, cn, f)
            cm_used, cn_used = _cdiv(M, sm), _cdiv(N, sn)
            if (cm_used, cn_used) != (cm, cn):
                continue  # the same split as a smaller one
            blocks = batch * cm * cn
            used = min(spec.aic_cores, blocks)
            waves = _cdiv(blocks, used)
            for bm, bn, bk in _base_candidates(sh, sm, sn, spec, whole_rows):
                if bm * bn * per > ub:
                    continue
                t = _fit_l1(sh, sm, sn, bm, bn, bk, spec)
                if t is None:
                    continue
                depth_a, depth_b, order = t
                reads = batch * _all_reads(sh, sm, sn, bm, bn, bk, depth_a, depth_b, order)
                padded = _up(sm, bm) * _up(sn, bn) * _up(K, bk)
                compute_us = waves * 2 * padded * fp32 / flops_per_us
                moved = reads + batch * M * N * c_bytes
                # a core draws at most its share of HBM (hbm / aic_cores): a split over few
                # cores waits on their loads even when the total is small
                per_core = waves * moved / blocks * spec.aic_cores
                memory_us = max(moved, per_core) / (spec.hbm_gbps * 1e3)
                us = max(compute_us, memory_us)
                found.append(((reads, -used, -bm * bn), cm, cn, sm, sn, bm, bn, bk, depth_a,
                              depth_b, order, reads, used, us))
    # times within one step (1 / TIME_STEPS us) of the fastest are equal: a gain below it
    # does not justify more GM bytes; among them the fewest reads, then the most cores
    fastest = min((c[-1] for c in found), default=0.0)
    best = min((c for c in found if c[-1] <= fastest + 1 / TIME_STEPS),
               key=lambda c: c[0], default=None)
    if best is None and whole_rows:
        raise NoTiling(f"no base tile holds whole rows of N = {N} ({a_bytes}-byte operands, a "
                       f"reduction along N in the epilogue) on the target {spec.name}: baseN "
                       f"{_up(N, f)} with baseM and baseK at least {f} needs L0B "
                       f"{2 * f * _up(N, f) * b_bytes} of {spec.l0b_bytes}, L0C "
                       f"{f * _up(N, f) * 4} of {spec.l0c_bytes} and UB "
                       f"{f * _up(N, f) * per + ub_reserved} of {spec.ub_bytes} bytes")
    if best is None:
        raise NoTiling(f"no base tile of a {M}x{N}x{K} matmul ({a_bytes}-byte operands) fits "
                       f"the target {spec.name}: L0A {spec.l0a_bytes}, L0B {spec.l0b_bytes}, "
                       f"L0C {spec.l0c_bytes}, L1 {spec.l1_bytes}, UB {spec.ub_bytes} bytes "
                       f"with {ub_reserved} reserved for the epilogue")
    _, cm, cn, sm, sn, bm, bn, bk, depth_a, depth_b, order, reads, used, us = best
    kt = _cdiv(K, bk)
    split = batch * (M * K * cn * a_bytes + K * N * cm * b_bytes)
    return CubeTiling(
        usedCoreNum=used, M=M, N=N, Ka=K, Kb=K, singleCoreM=sm, singleCoreN=sn, singleCoreK=K,
        baseM=bm, baseN=bn, baseK=bk, depthA1=depth_a, depthB1=depth_b,
        stepM=max(1, depth_a // kt), stepN=max(1, depth_b // kt),
        stepKa=min(kt, depth_a), stepKb=min(kt, depth_b), isBias=int(bias),
        iterateOrder=order, transLength=bm * bn * c_bytes, batch=batch, coresM=cm, coresN=cn,
        gm_bytes=reads, split_bytes=split, modeled_us=round(us, 3))


def _fit_l1(sh: _Shape, sm: int, sn: int, bm: int, bn: int, bk: int, spec: Target
            ) -> tuple[int, int, int] | None:
    """(depthA1, depthB1, iterateOrder) for these base tiles: the L1 split with the fewest
    reads; None when not even two base tiles of each operand fit L1."""
    ta, tb = bm * bk * sh.a, bk * bn * sh.b
    budget = spec.l1_bytes - (bn * 4 if sh.bias else 0)
    if 2 * ta + 2 * tb > budget:
        return None
    tm, tn, kt = _cdiv(sm, bm), _cdiv(sn, bn), _cdiv(sh.K, bk)
    options = []
    for order in (0, 1):
        inner_t, outer_t = (ta, tb) if order == 0 else (tb, ta)
        inner_n = tm if order == 0 else tn
        # the outer operand's panel, and as many inner panels as fit (all, one, or streamed)
        for outer_d in (kt, 2):
            for inner_d in (inner_n * kt, kt, 2):
                if outer_d * outer_t + inner_d * inner_t > budget:
                    continue
                da, db = (inner_d, outer_d) if order == 0 else (outer_d, inner_d)
                reads = panel_reads(sm, sn, sh.K, bm, bn, bk, da, db, order, sh.a, sh.b,
                                    sh.bias)
                options.append((reads, order, da, db))
    if not options:
        return None
    reads, order, da, db = min(options)
    return da, db, order


def row_limit(a_bytes: int, b_bytes: int, spec: Target) -> int:
    """The longest row (N) a base tile can hold whole: ``baseN`` with baseM and baseK at
    their least within L0B and L0C (the epilogue's UB is checked by the tiling itself)."""
    f, ka = spec.cube_fractal, spec.cube_k_align(min(a_bytes, b_bytes))
    return min(spec.l0b_bytes // 2 // (ka * b_bytes), spec.l0c_bytes // (f * 4)) // f * f


def gm_bytes(t: CubeTiling, a_bytes: int, b_bytes: int) -> int:
    """GM bytes of A, B and the bias the cores of tiling ``t`` read (the model above)."""
    sh = _Shape(t.M, t.N, t.Ka, t.batch, a_bytes, b_bytes, 0, bool(t.isBias), 0)
    return t.batch * _all_reads(sh, t.singleCoreM, t.singleCoreN, t.baseM, t.baseN, t.baseK,
                                t.depthA1, t.depthB1, t.iterateOrder)


def l1_bytes(t: CubeTiling, a_bytes: int, b_bytes: int) -> int:
    """L1 bytes a tiling uses: its A and B base tiles and the bias row."""
    return (t.depthA1 * t.baseM * t.baseK * a_bytes + t.depthB1 * t.baseK * t.baseN * b_bytes
            + (t.baseN * 4 if t.isBias else 0))


def violations(t: CubeTiling, a_bytes: int, b_bytes: int, c_bytes: int, spec: Target,
               ub_reserved: int = 0, ub_per_elem: int | None = None) -> list[str]:
    """Every constraint of the reference a tiling breaks (empty: a valid tiling)."""
    f, ka = spec.cube_fractal, spec.cube_k_align(min(a_bytes, b_bytes))
    bad = []
    if t.baseM % f or t.baseN % f:
        bad.append(f"baseM {t.baseM} / baseN {t.baseN} not multiples of {f}")
    if t.baseK % ka:
        bad.append(f"baseK {t.baseK} not a multiple of {ka}")
    if t.baseM * t.baseK * a_bytes > spec.l0a_bytes // 2:
        bad.append("baseM·baseK·sizeof(A) exceeds half of L0A")
    if t.baseK * t.baseN * b_bytes > spec.l0b_bytes // 2:
        bad.append("baseK·baseN·sizeof(B) exceeds half of L0B")
    if t.baseM * t.baseN * 4 > spec.l0c_bytes:
        bad.append("baseM·baseN·4 exceeds L0C")
    if l1_bytes(t, a_bytes, b_bytes) > spec.l1_bytes:
        bad.append("depthA1/depthB1 base tiles exceed L1")
    if t.baseM * t.baseN * (ub_per_elem or c_bytes) + ub_reserved > spec.ub_bytes:
        bad.append("the C tile and the epilogue exceed UB")
    if t.usedCoreNum > spec.aic_cores or t.coresM * t.coresN > spec.aic_cores:
        bad.append("more cores than the target's AIC")
    if t.coresM * t.singleCoreM < t.M or t.coresN * t.singleCoreN < t.N:
        bad.append("the core blocks do not cover M x N")
    if t.singleCoreM % f and t.coresM > 1 or t.singleCoreN % f and t.coresN > 1:
        bad.append("a core block does not start on a fractal boundary")
    if t.Ka != t.Kb or t.singleCoreK != t.Ka:
        bad.append("K is split")
    if t.depthA1 < 1 or t.depthB1 < 1:
        bad.append("no base tile of A or B in L1")
    return bad
