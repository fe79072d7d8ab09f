"""What the fusion passes share: matching helpers over onnx-ir and a rewrite-pass base.

A fusion pass is a pattern and a rewrite: :class:`RewritePass` visits every node of the
main graph (in order, again until nothing changes) and calls :meth:`RewritePass.rewrite`,
which returns True when it replaced the node's neighbourhood. The helpers below answer the
questions every pattern asks: which node produced a value, is it used once, is it a
constant, a scalar.
"""

from __future__ import annotations

import abc
import contextvars
from collections.abc import Sequence
from typing import TypeGuard

import numpy as np
import onnx_ir as ir

AIOINFER_DOMAIN = "ai.aioinfer"
"""The domain of aioinfer's own (fused) operators; version 1."""


def is_op(node: ir.Node | None, *op_types: str, domain: str = "") -> TypeGuard[ir.Node]:
    """Whether ``node`` is one of ``op_types`` of ``domain`` ("ai.onnx" counts as "")."""
    if node is None:
        return False
    node_domain = "" if node.domain == "ai.onnx" else node.domain
    return node_domain == domain and node.op_type in op_types


_scope: contextvars.ContextVar[ir.Graph | None] = contextvars.ContextVar(
    "rewrite_scope", default=None
)
"""The graph a :class:`RewritePass` rewrites now: patterns never reach into another."""


def producer(value: ir.Value | None, *op_types: str, domain: str = "") -> ir.Node | None:
    """The node of one of ``op_types`` that produced ``value``, else None (also when it
    is a node of another graph than the one being rewritten: a subgraph reads values of
    enclosing graphs, whose nodes it must not fuse or remove)."""
    if value is None:
        return None
    node = value.producer()
    scope = _scope.get()
    if node is not None and scope is not None and node.graph is not scope:
        return None
    return node if is_op(node, *op_types, domain=domain) else None


def only_use(value: ir.Value | None) -> ir.Node | None:
    """The one node that reads ``value`` when it has exactly one use and is no graph
    output (so a rewrite may make it disappear), else None."""
    if value is None or value.is_graph_output():
        return None
    uses = list(value.uses())
    if len(uses) != 1:
        return None
    return uses[0][0]


def fed_by(
    value: ir.Value | None, reader: ir.Node, *op_types: str, domain: str = ""
) -> ir.Node | None:
    """The node of one of ``op_types`` that produced ``value`` (see :func:`producer`)
    when ``reader`` is the one node that reads it (see :func:`only_use`), else None."""
    return producer(value, *op_types, domain=domain) if only_use(value) is reader else None


def only_read_by(value: ir.Value, readers: Sequence[ir.Node]) -> bool:
    """Whether ``value`` is no graph output and every node that reads it is one of
    ``readers``."""
    if value.is_graph_output():
        return False
    return all(any(user is node for node in readers) for user, _ in value.uses())


def single_use(value: ir.Value | None) -> bool:
    """Whether ``value`` is read by exactly one node and is no graph output."""
    return only_use(value) is not None


def defined_in(value: ir.Value, graph: ir.Graph) -> bool:
    """Whether ``value`` is an input, an initializer or a node output of ``graph`` itself
    (a graph's outputs cannot be values of an enclosing graph)."""
    node = value.producer()
    return node.graph is graph if node is not None else value.graph is graph


def input_at(node: ir.Node, index: int) -> ir.Value | None:
    """Input ``index`` of ``node``, None when it has fewer inputs or omits that one."""
    return node.inputs[index] if index < len(node.inputs) else None


def other_input(node: ir.Node, value: ir.Value | None) -> ir.Value | None:
    """The input of the binary ``node`` that is not ``value`` (its first, unless that is
    ``value``)."""
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def constant(value: ir.Value | None) -> np.ndarray | None:
    """The compile-time value of ``value`` (an initializer), else None."""
    if value is None or value.const_value is None:
        return None
    return np.asarray(value.const_value.numpy())


def ints(value: ir.Value | None) -> list[int] | None:
    """The values of an integer constant, flattened, else None."""
    array = constant(value)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def scalar(value: ir.Value | None) -> float | None:
    """The value of a constant with a single element, as a float, else None."""
    array = constant(value)
    if array is None or array.size != 1 or array.dtype.kind not in "fiu":
        return None
    return float(array.reshape(()))


def rank(value: ir.Value | None) -> int | None:
    """The number of axes of ``value``, None when unknown."""
    return None if value is None or value.shape is None else len(value.shape)


def grows_rank(array: np.ndarray, value: ir.Value | None) -> bool:
    """Whether a constant ``array`` broadcast with ``value`` may give more axes than
    ``value`` has (a non-scalar may, when ``value``'s rank is unknown)."""
    axes = rank(value)
    return array.ndim > 0 and (axes is None or array.ndim > axes)


def initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """Register ``array`` as a new initializer of ``graph`` named after ``name``."""
    unique, index = name, 0
    while unique in graph.initializers:
        index += 1
        unique = f"{name}_{index}"
    value = ir.Value(
        name=unique,
        shape=ir.Shape(array.shape),
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        const_value=ir.tensor(array, name=unique),
    )
    graph.register_initializer(value)
    return value


def stand_for(old: ir.Value, new: ir.Value) -> None:
    """Make ``new`` stand for ``old``: its name, shape and type, every use and graph
    output."""
    new.shape, new.type = old.shape, old.type
    name = old.name
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    if name:
        old.name = None
        new.name = name


def replace(
    graph: ir.Graph,
    old_nodes: Sequence[ir.Node],
    new_node: ir.Node,
    old_output: ir.Value,
) -> None:
    """Put ``new_node`` where the last of ``old_nodes`` was, make its first output stand
    for ``old_output`` (same name, shape and type, every use and graph output), and remove
    ``old_nodes``, listed so that each comes before the nodes that read it."""
    last = old_nodes[-1]
    graph.insert_before(last, new_node)
    stand_for(old_output, new_node.outputs[0])
    for node in reversed(old_nodes):
        graph.remove(node, safe=True)


class RewritePass(ir.passes.InPlacePass):
    """Run :meth:`rewrite` on every node of the main graph until nothing changes."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        modified = False
        changed = True
        token = _scope.set(graph)
        try:
            while changed:
                changed = False
                for node in list(graph):
                    if node.graph is graph and self.rewrite(graph, node):
                        changed = modified = True
        finally:
            _scope.reset(token)
        if modified:
            model.opset_imports.setdefault(AIOINFER_DOMAIN, 1)
        return ir.passes.PassResult(model, modified=modified)

    @abc.abstractmethod
    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        """Rewrite the pattern rooted at ``node``, if it matches; return whether it did."""
