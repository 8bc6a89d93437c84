"""graphkernel.codegen (filled in as the pipeline grows)."""
