"""The code generator: a GraphKernel node becomes an Ascend C kernel. ``schedule`` chooses the loop
space and every value's layout, ``lower`` turns the steps into vector calls over a UB tile,
``tiling`` sizes the tiles as the host tiling function will, ``ascendc`` renders the sources
from ``templates/``, ``phases`` and ``superkernel`` split or merge kernels, ``traffic`` counts
the GM bytes of every launch and ``cost`` models its time, ``targets`` reads the target files in
``targets/``, and ``backend`` writes the kernel project or runs the kernels in the simulator
(``sim/``)."""
