"""graphkernel: a graph-kernel fusion compiler for Ascend NPUs."""

import os as _os

# In a source tree, passes/, expanders/, patterns/ and codegen/ sit beside this package
# and are its subpackages (pyproject.toml maps them the same way when installed).
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and \
        _os.path.isfile(_os.path.join(_root, "passes", "__init__.py")):
    __path__.append(_root)  # noqa: F821 - the package's own search path

# Importing these registers every op, expander and pass (no manual imports for users).
from graphkernel import ops  # noqa: E402,F401,I001
from graphkernel import expanders  # noqa: E402,F401
from graphkernel import patterns  # noqa: E402,F401
from graphkernel import passes  # noqa: E402,F401
from graphkernel.api import CompileResult, compile, load_config  # noqa: E402
from graphkernel.bisect import bisect, verify  # noqa: E402
from graphkernel.errors import GraphKernelError  # noqa: E402
from graphkernel.ir import DType, Graph, Node, TensorType, Value  # noqa: E402

__version__ = "0.1.0"

__all__ = ["CompileResult", "DType", "Graph", "GraphKernelError", "Node", "TensorType", "Value",
           "__version__", "bisect", "compile", "load_config", "verify"]
