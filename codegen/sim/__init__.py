"""The CPU simulator of the Ascend C subset graphkernel emits (header + g++ runner)."""
