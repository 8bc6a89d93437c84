"""graphkernel.patterns (filled in as the pipeline grows)."""
