"""graphkernel: a graph-kernel fusion compiler for Ascend NPUs.

The core package: the IR (``tensor_types``, ``ir``, ``symbolic``, ``textir``), the op registry
(``ops``) and the op definitions (``opdefs/``), the numpy ``interpreter``, the flags
(``flags``) and the pass manager (``registry``, ``pipeline``), the fusion model
(``fusion``, ``kernels``), the user-facing entry points (``api``, ``cli``, ``torch``,
``bisect``, ``verify``, ``explain``) and file handling (``frontends/``, ``dump``, ``fileio``,
``outdir``). Passes, expanders, patterns and the code generator are its subpackages
``graphkernel.passes``, ``.expanders``, ``.patterns`` and ``.codegen``."""

import importlib.abc as _abc
import importlib.util as _util
import os as _os
import sys as _sys

_SUBPACKAGES = ("passes", "expanders", "patterns", "codegen")


class _SourceTreeFinder(_abc.MetaPathFinder):
    """Finds ``graphkernel.passes``, ``.expanders``, ``.patterns`` and ``.codegen`` in a source
    tree, where those folders sit beside this package (pyproject.toml maps them the same way
    when installed). Only these four names are mapped: the repository root itself never
    joins the package's ``__path__``, so walking the package (``pkgutil.walk_packages``, as
    ``TORCH_LOGS=graphkernel`` does) cannot find ``graphkernel.graphkernel`` and recurse."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.folders = {f"{__name__}.{n}": _os.path.join(root, n) for n in _SUBPACKAGES}

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib's API
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return _util.spec_from_file_location(fullname, _os.path.join(folder, "__init__.py"),
                                             submodule_search_locations=[folder])


def _install_source_tree_finder() -> None:
    """In a source tree (a checkout, ``pip install -e .``, ``PYTHONPATH=<checkout>``) map the
    four subpackages to the folders beside this one, ahead of any other finder, so that the
    checkout this package came from also provides its subpackages. A wheel holds them inside
    the package, where the ordinary import finds them."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    root = _os.path.dirname(here)
    if _os.path.isdir(_os.path.join(here, _SUBPACKAGES[0])) or not (
            _os.path.isfile(_os.path.join(root, "pyproject.toml"))
            and all(_os.path.isfile(_os.path.join(root, n, "__init__.py"))
                    for n in _SUBPACKAGES)):
        return
    _sys.meta_path[:] = [f for f in _sys.meta_path if type(f).__name__ != "_SourceTreeFinder"]
    _sys.meta_path.insert(0, _SourceTreeFinder(root))


_install_source_tree_finder()

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
