"""graphkernel: a graph-kernel fusion compiler for Ascend NPUs."""

from graphkernel import (
           ops,  # noqa: F401  (registers every op)
           passes,  # noqa: F401  (registers every pass)
)
from graphkernel.api import CompileResult, compile, load_config
from graphkernel.errors import GraphKernelError
from graphkernel.ir import DType, Graph, Node, TensorType, Value

__version__ = "0.1.0"

__all__ = ["CompileResult", "DType", "Graph", "GraphKernelError", "Node", "TensorType", "Value",
           "__version__", "compile", "load_config"]
