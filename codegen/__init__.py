"""The code generator: a GraphKernel node becomes an Ascend C kernel, in the steps
docs/codegen.md lists: ``legalize`` (what the generator accepts, how a refused kernel is
split; ``refusal``: why, and the node), the schedule (``vector/`` for vector kernels,
``cube/`` for matrix products on the Matmul API and MIX kernels), the lowering into the kernel
IR (``lower``: one engine over ``instructions``, the op table; ``kernel_ir``: the records and
the table rendering them), the buffer plan (``buffers``), tiling, syncs and barriers
(``barriers``) and rendering (``render`` and each path's own). Beside them: the target facts
(``targets``), the GM traffic (``traffic``) and cost (``cost``) models, extern operators
(``extern``), schedules carried over to equal bodies (``instance``), SuperKernels
(``superkernel``), fp32 accumulation (``accumulate``), and ``backend``, which writes the
kernel project or runs the kernels in the simulator (``sim/``)."""
