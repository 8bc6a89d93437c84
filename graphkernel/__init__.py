"""graphkernel: a graph-kernel fusion compiler for Ascend NPUs.

The core package: the IR (``tensor_types``, ``ir``, ``symbolic``, ``textir``), the op registry
(``ops``) and the op definitions (``opdefs/``), the numpy ``interpreter``, the flags
(``flags``) and the pass manager (``registry``, ``pipeline``), the fusion model
(``fusion``, ``kernels``), the user-facing entry points (``api``, ``cli``, ``torch``,
``bisect``, ``verify``, ``explain``) and file handling (``frontends/``, ``dump``, ``fileio``,
``outdir``). Passes, expanders, patterns and the code generator are its subpackages
``graphkernel.passes``, ``.expanders``, ``.patterns`` and ``.codegen``."""

import os as _os

# In a source tree, passes/, expanders/, patterns/ and codegen/ sit beside this package
# and are its subpackages (pyproject.toml maps them the same way when installed).
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and \
        _os.path.isfile(_os.path.join(_root, "passes", "__init__.py")):
    __path__.append(_root)  # noqa: F821 - the package's own search path

# Importing these registers every op, expander and pass (no manual imports for users).
from graphkernel import ops, opdefs, kernels  # noqa: E402,F401,I001
from graphkernel import expanders  # noqa: E402,F401
from graphkernel import patterns  # noqa: E402,F401
from graphkernel import passes  # noqa: E402,F401
from graphkernel.api import CompileResult, compile, load_config  # noqa: E402
from graphkernel import bisect, verify  # noqa: E402,F401 - modules, not shadowed
from graphkernel.errors import GraphKernelError  # noqa: E402
from graphkernel.ir import DType, Graph, Node, TensorType, Value  # noqa: E402

__version__ = "0.1.0"

__all__ = ["CompileResult", "DType", "Graph", "GraphKernelError", "Node", "TensorType", "Value",
           "__version__", "compile", "load_config"]
