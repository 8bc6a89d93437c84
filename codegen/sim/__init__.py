"""The CPU simulator of the Ascend C subset graphkernel emits: ``ascendc_sim.h`` models the
API and checks what the device requires (bounds, alignment, UB budget, synchronisation),
``runner`` builds the kernels with g++ into a cached library, ``execute`` runs them on numpy
arrays and collects per-kernel statistics."""
