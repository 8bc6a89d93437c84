"""graphkernel.passes (filled in as the pipeline grows)."""
