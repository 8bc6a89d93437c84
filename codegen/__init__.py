"""The code generator: a GraphKernel node becomes an Ascend C kernel. ``vector/`` holds the
vector path (schedule, UB tiling, rendering of vector kernels) and ``cube/`` the cube path
(matrix products on the Matmul API and MIX kernels); at this level sit what both share: the
target facts (``targets``), the instruction table (``instructions``), the lowering
(``lower``), the buffer plan (``buffers``), the vector barriers (``barriers``), rendering
helpers (``render``), the GM traffic (``traffic``) and cost (``cost``) models, extern
operators (``extern``), kernels sharing one body (``instance``), SuperKernels
(``superkernel``), and ``backend``, which writes the kernel project or runs the kernels in the
simulator (``sim/``)."""
