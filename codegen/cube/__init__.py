"""The cube path: a matrix product on the Matmul API (a cube kernel) and, fused with it, vector
work on each base tile of its result (a MIX kernel). ``schedule`` reads the operands and the
batch layout, ``epilogue`` schedules the vector work, ``tiling`` chooses the cube tiling,
``render`` writes the kernel sources."""
