"""graphkernel.expanders (filled in as the pipeline grows)."""
