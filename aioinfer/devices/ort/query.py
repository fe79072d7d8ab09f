"""Which nodes onnxruntime runs: ``ORT``'s ``query_model``.

A node runs when onnxruntime has a kernel for its operator, and also when onnxruntime
removes or rewrites it before it looks for kernels, which its kernel table does not show:

- ``Constant``: made an initializer when the graph loads (at every optimization level),
  so it has no kernel; PyTorch's exporter emits one for every literal;
- an ONNX operator defined by a function (``HardSwish``, ``Mish``, ``CastLike``,
  ``GroupNormalization``, ...) without a kernel: onnxruntime inlines its body, so it
  runs when the body's operators do (a body that depends on the node's types is not
  built here: such bodies use basic operators, and the compile has the last word).

Fusions need no rule: onnxruntime fuses nodes that each have a kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import onnx
from onnx.defs import SchemaError, get_schema
from onnxruntime.capi.onnxruntime_pybind11_state import get_all_opkernel_def

from aioinfer.model import Model, takes_strings
from aioinfer.opsets import node_opset

FOLDED_AT_LOAD = frozenset({("", "Constant")})
"""Operators onnxruntime turns into initializers when it loads a graph."""


@functools.cache
def _kernels() -> dict[tuple[str, str], tuple[Sequence[int], ...]]:
    """(domain, operator) -> the version ranges this onnxruntime build has kernels for."""
    kernels: dict[tuple[str, str], list[Sequence[int]]] = {}
    for kernel in get_all_opkernel_def():
        domain = "" if kernel.domain == "ai.onnx" else kernel.domain
        kernels.setdefault((domain, kernel.op_name), []).append(kernel.version_range)
    return {key: tuple(ranges) for key, ranges in kernels.items()}


@functools.cache
def runs(domain: str, op_type: str, opset: int) -> bool:
    """Whether onnxruntime runs operator ``op_type`` of ``domain`` (``""`` for ``ai.onnx``)
    imported at version ``opset``: it has a kernel for the operator's definition at that
    opset, folds it at load, or inlines its function body whose operators all run."""
    if (domain, op_type) in FOLDED_AT_LOAD:
        return True
    schema: Any  # onnx's stubs lack OpSchema's function attributes
    try:  # the version of the operator's definition the node uses
        schema = get_schema(op_type, opset, domain)
    except SchemaError:  # a domain onnx does not know (com.microsoft)
        schema = None
    version = schema.since_version if schema is not None else opset
    ranges = _kernels().get((domain, op_type), ())
    if any(low <= version <= high for low, high in ranges):
        return True
    if schema is None or schema.deprecated:
        return False
    if schema.has_context_dependent_function:
        return True
    if not schema.has_function:
        return False
    body = onnx.FunctionProto.FromString(schema.get_function_with_opset_version(opset))
    imported = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in body.opset_import}
    return all(
        runs(node.domain, node.op_type, imported.get(node.domain or "", opset))
        for node in body.node
    )


def supported_nodes(model: Model, device_name: str) -> dict[str, str]:
    """The nodes of ``model``'s main graph that onnxruntime runs (see :func:`runs`) and
    that take and give no string tensor (onnxruntime's strings are text: bytes that are
    not UTF-8 cannot pass, where the other devices carry any bytes); other element types
    are not checked."""
    supported = {}
    opsets = model.ir.opset_imports
    for index, node in enumerate(model.ir.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if not takes_strings(node) and runs(domain, node.op_type, node_opset(node, opsets)):
            supported[node.name or f"{node.op_type}_{index}"] = device_name
    return supported
