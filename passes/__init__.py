"""The passes of the pipeline, one module each: expansion, simplification, clustering, the split
into GraphKernel nodes, post-fusion rewrites and code generation. ``PIPELINE`` below is the
whole pipeline in the order it runs; importing this package registers it
(``graphkernel passes`` shows it with what is on at each level and why)."""

from graphkernel.passes import (
    arith_simplify,
    attention,
    attention_sinks,
    axis_normalize,
    cast_elim,
    channels_last,
    cluster,
    codegen,
    concat_sink,
    constant_fold,
    conv_bn_fold,
    conv_fusion,
    conv_matmul,
    cse,
    dce,
    expand,
    interleaved_columns,
    matmul_group,
    matvec,
    moe_routing,
    movement_gather,
    parallel_fusion,
    pool_into_product,
    product_broadcast,
    product_transpose,
    product_zero_blocks,
    promote_precision,
    recompute,
    reduce_merge,
    reshape_elim,
    rotary_halves,
    rotary_pairs,
    scan,
    scan_loop,
    scan_prologue,
    scatter_slices,
    sibling_fusion,
    slice_phases,
    small_ints,
    split,
    split_slices,
    super_kernel,
    transpose_elim,
    transpose_hoist,
    transpose_view,
    trisolve,
    validate,
    window_fusion,
)
from graphkernel.registry import Step, register_steps

# Read top to bottom. ``order`` places a plugin's pass among these (a plugin registered with
# stage="simplify", order=52 runs between transpose_elim and channels_last); ``level`` is the
# lowest opt_level that runs the pass; ``feature`` is the flag that switches it whatever the
# level. A pass listed twice runs twice (selected as dce:1, dce:2).
PIPELINE = (
    #    stage        order  pass                                level
    Step("preprocess", 0, validate.validate, 0, required=True),
    Step("preprocess", 10, axis_normalize.axis_normalize, 1),
    Step("expand", 10, expand.expand, 1),
    Step("expand", 90, dce.dce, 1),
    Step("simplify", 10, constant_fold.constant_fold, 2),
    Step("simplify", 20, arith_simplify.arith_simplify, 2),
    Step("simplify", 30, cse.cse, 2),
    Step("simplify", 31, trisolve.trisolve, 2),  # after cse: one slice per row read
    Step("simplify", 33, small_ints.small_ints, 2),  # before scan (a float CumSum)
    Step("simplify", 35, scan.scan, 2),
    Step("simplify", 36, rotary_pairs.rotary_pairs, 2),  # cos/sin tables folded
    Step("simplify", 36.5, rotary_halves.rotary_halves, 2),  # after rotary_pairs' halves
    Step("simplify", 37, moe_routing.moe_routing, 2),
    Step("simplify", 38, slice_phases.slice_phases, 2),  # before the reshape/transpose folds
    Step("simplify", 40, reshape_elim.reshape_elim, 2),
    Step("simplify", 50, transpose_elim.transpose_elim, 2),
    Step("simplify", 53, channels_last.channels_last, 2),
    Step("simplify", 55, concat_sink.concat_sink, 2),
    Step("simplify", 60, cast_elim.cast_elim, 2),
    Step("simplify", 90, dce.dce, 1),
    Step("simplify", 94, attention_sinks.attention_sinks, 2),  # before attention
    Step("simplify", 95, attention.attention, 2),  # after dce: dead users are no uses
    Step("simplify", 96, conv_bn_fold.conv_bn_fold, 2),  # constants folded: alpha, beta
    Step("simplify", 96.5, conv_matmul.conv_matmul, 2),  # folded first; matvec takes 1 pixel
    Step("simplify", 97, matvec.matvec, 2),  # after attention, whose matching reads products
    Step("simplify", 97.1, scan_loop.scan_loop, 2),  # after matvec: per-step sums rolled up
    Step("simplify", 97.3, product_transpose.product_transpose, 2),  # after matvec
    Step("simplify", 97.5, transpose_hoist.transpose_hoist, 2),  # after attention
    Step("simplify", 98, transpose_view.transpose_view, 2),  # after attention (head splits)
    Step("simplify", 99, product_broadcast.product_broadcast, 2),  # after attention
    Step("simplify", 99.5, split_slices.split_slices, 2),  # after the products' rewrites
    Step("simplify", 99.6, product_zero_blocks.product_zero_blocks, 2),  # after the views
    Step("simplify", 99.7, scan_prologue.scan_prologue, 2),  # after the transposes' folds
    Step("simplify", 99.8, interleaved_columns.interleaved_columns, 2),  # constants folded
    Step("simplify", 99.9, pool_into_product.pool_into_product, 2),  # constants folded
    Step("simplify", 99.95, scatter_slices.scatter_slices, 2),  # after moe_routing's
    Step("simplify", 99.96, movement_gather.movement_gather, 2),  # after the views' folds
    Step("simplify", 99.97, reduce_merge.reduce_merge, 2),  # constants folded
    Step("cluster", 10, cluster.cluster, 1),
    Step("split", 10, split.split, 1),
    Step("split", 20, recompute.recompute, 2, feature="enable_recompute_fusion"),
    Step("split", 30, sibling_fusion.sibling_fusion, 2),  # after recompute's inlining
    Step("postfusion", 10, parallel_fusion.parallel_fusion, 3, feature="enable_parallel_fusion"),
    Step("postfusion", 20, window_fusion.window_fusion, 2),  # pools: window kernels
    Step("postfusion", 25, conv_fusion.conv_fusion, 2),  # kxk convolutions: MIX kernels
    Step("postfusion", 30, promote_precision.promote_precision, 2),
    Step("postfusion", 40, matmul_group.matmul_group, 2, feature="enable_matmul_group"),
    Step("postfusion", 50, super_kernel.super_kernel, 3, feature="enable_super_kernel"),
    Step("codegen", 50, codegen.codegen, 1),
)

# after the last pass: the final GM-traffic figures of the report
register_steps(PIPELINE, finish=(split.traffic_summary,))
