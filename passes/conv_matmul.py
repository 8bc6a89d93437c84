"""Rewrite a 1x1 convolution (one group, no padding) → a matrix product of its channels.

A 1x1 convolution mixes channels and nothing else: in NCHW each image is
``out[n] = W[M, C] @ x[n][C, H*W]``, a batched product whose weight is shared by the batch
(stride 0); in NHWC the pixels are rows, ``out = x[N*H*W, C] @ W[M, C]ᵀ``. As a product it is
a MatMul/BatchMatMul of the cube kernels, so its bias, a batch norm's affine that did not fold,
its activation, a residual add and a cast run in the product's output tile (one MIX kernel,
``patterns/matmul.py``) instead of a cube launch and a vector kernel reading the result back.
The reshapes only regroup contiguous axes (views). Exact: the product sums the same
terms.

Runs after ``conv_bn_fold`` (a frozen batch norm folds into the convolution's weights first)
and before ``matvec``. Left as a convolution, with the reason in the pass's notes (shown by
explain): kernels larger than 1x1, groups, padding, a dtype other than a float; a stride (the
product of a strided view of the input: the view is a vector kernel of its own, which costs
the launch the epilogue saves); weights that are not constants (a training graph: on
MobileNetV2's ill-conditioned training step, 8 values per channel batch-normalised after
ReLU6, the products' rounding put 91 of 158 gradients further than twice eager's from a
float64 twin's, against 2 as convolutions, while on a well-conditioned inverted residual
block they stay within 0.7-1.3x eager's; frozen parameters are what it is for); one pixel
of one image (a product of one row, whose vector form, ``matvec``'s, does not fuse with the
pool and the activation around it).

A squeeze-and-excitation block's convolutions on the pooled channels (one pixel per image,
several images) are the 2-D product ``pooled[N, C] @ W[M, C]ᵀ``, as NHWC ones are: the
first one's bias and activation, the second one's bias and gate (sigmoid, hard sigmoid) run
in their tiles (two MIX kernels instead of two cube launches and two vector kernels), and
the gate's product with the block's input is the one vector kernel after them (the
elementwise patterns leave the gate to the product's epilogue).
"""

from __future__ import annotations

from graphkernel import symbolic
from graphkernel.analyses import ConvProduct
from graphkernel.ir import Graph, Node, Value
from graphkernel.passes.rewrite import add_like, const_array
from graphkernel.registry import PassResult, counted


def refusal(n: Node) -> str | None:
    """Why the convolution ``n`` is not a product of its channels, or None when it is."""
    w = n.inputs[1]
    a = n.attrs
    if tuple(w.shape[2:]) != (1, 1):
        return f"a {w.shape[2]}x{w.shape[3]} kernel (a product of channels is 1x1)"
    if a["group"] != 1:
        return f"{a['group']} groups (one product per group)"
    if any(p != 0 for p in a["pads"]):
        return f"pads {list(a['pads'])} (the product reads no padding)"
    if not n.inputs[0].dtype.is_float:
        return f"{n.inputs[0].dtype.value} data"
    if const_array(w) is None:  # (measured: see the module's docstring)
        return "weights that are not constants (a training graph)"
    if tuple(a["strides"]) != (1, 1):  # (measured: the view's kernel costs what it saves)
        return f"strides {list(a['strides'])} (the strided view would be a kernel of its own)"
    batch = n.outputs[0].shape[0]
    if _one_pixel(n) and not (symbolic.is_static(batch) and int(batch) > 1):
        return "one pixel of one image (a product of one row: the matvec pass would make it " \
               "vector work that does not fuse with the pool and activation around it)"
    return None


def _one_pixel(n: Node) -> bool:
    """A convolution of one pixel per image (a squeeze-and-excitation block's, on the pooled
    channels)."""
    out = n.outputs[0].shape
    pixels = symbolic.numel(out[1:3] if n.attrs["data_format"] == "NHWC" else out[2:])
    return symbolic.is_static(pixels) and int(pixels) == 1


def _weight(g: Graph, n: Node) -> Value:
    """The constant weight ``[M, C, 1, 1]`` as ``[M, C]``."""
    w = n.inputs[1]
    return g.const(const_array(w).reshape(w.shape[0], w.shape[1]),
                   name=g.fresh_name(f"{n.name}_w"))


def _view(g: Graph, n: Node, x: Value, shape: list) -> Value:
    """``x`` viewed as ``shape``: a Reshape another convolution of ``x`` already made, else a
    new one. Two products of one input (a projection shortcut and the block's first 1x1
    convolution) then read one value, which the kernel computing ``x`` writes once and which
    ``matmul_group`` sees as their shared operand."""
    for u in x.users:
        if u.op == "Reshape" and u.graph is g and list(u.outputs[0].shape) == list(shape):
            return u.outputs[0]
    return add_like(g, n, "Reshape", [x], {"shape": shape})


def _rewrite(g: Graph, n: Node) -> Value:
    x, w2 = n.inputs[0], _weight(g, n)
    # NHWC, or one pixel per image (its channels are then contiguous either way): the
    # pixels are the rows of a 2-D product, [N*H*W, C] @ [M, C]ᵀ
    nhwc = n.attrs["data_format"] == "NHWC" or _one_pixel(n)
    out = n.outputs[0]
    if nhwc:
        if n.attrs["data_format"] == "NHWC":
            nb, h, wd, c = x.shape
        else:
            nb, c, h, wd = x.shape
        rows = symbolic.numel((nb, h, wd))
        x2 = _view(g, n, x, [rows, c])
        y = add_like(g, n, "MatMul", [x2, w2], {"transpose_b": True})  # [N*H*W, M]
        bias_shape = [w2.shape[0]]
    else:
        nb, c, h, wd = x.shape
        x3 = _view(g, n, x, [nb, c, symbolic.mul(h, wd)])
        y = add_like(g, n, "BatchMatMul", [w2, x3])  # [N, M, H*W]: W broadcast over N
        bias_shape = [out.shape[1], 1]
    if len(n.inputs) == 3:
        b = n.inputs[2]
        arr = const_array(b)
        bv = (g.const(arr.reshape(bias_shape), name=g.fresh_name(f"{n.name}_b"))
              if arr is not None else add_like(g, n, "Reshape", [b], {"shape": bias_shape}))
        y = add_like(g, n, "Add", [y, bv])
    return add_like(g, n, "Reshape", [y], {"shape": list(out.shape)})


def conv_matmul(graph, ctx) -> PassResult:
    """Rewrite Conv2D 1x1 (groups 1, no pads) → Reshape, MatMul/BatchMatMul, bias Add,
    Reshape."""
    notes: list[str] = []
    done = 0
    for n in list(graph.nodes):
        if n.op != "Conv2D" or n.graph is None:
            continue
        why = refusal(n)
        if why is not None:
            if tuple(n.inputs[1].shape[2:]) == (1, 1):  # only 1x1 ones are worth a note
                notes.append(f"{n.name}: stays a convolution: {why}")
                ctx.analyses.conv_products.append(ConvProduct(n.name, "kept", why))
            continue
        if not ctx.should_apply(f"{n.name} as a product of channels", [n]):
            continue
        ctx.analyses.conv_products.append(ConvProduct(
            n.name, "product", "a batched product W[M, C] @ x[n][C, H*W]"
            if n.attrs["data_format"] == "NCHW" and not _one_pixel(n)
            else "a product x[N*H*W, C] @ W[M, C]ᵀ"))
        graph.replace_all_uses(n.outputs[0], _rewrite(graph, n))
        params = [v.producer for v in n.inputs[1:]]
        graph.erase_node(n)
        for p in params:  # (runs after dce: the old weights go here)
            if p is not None and p.graph is not None and p.op == "Constant" and not any(
                    v.uses or graph.is_output(v) for v in p.outputs):
                graph.erase_node(p)
        notes.append(f"{n.name}: a 1x1 convolution as a product of channels")
        done += 1
    if done:
        graph.toposort()
    return PassResult(done > 0, done, notes,
                      f"{counted(done, 'convolution')} as products of channels")
