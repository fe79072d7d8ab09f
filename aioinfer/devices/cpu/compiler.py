"""Lowering: an IR graph becomes a :class:`Plan` of bound kernels over numbered slots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu.kernels.registry import (
    find_kernel,
    find_out_kernel,
    make_spec,
)
from aioinfer.devices.cpu.plan import NONE_SLOT, SCRATCH_SLOT, Plan, Step, releases
from aioinfer.errors import CompileError, UnsupportedOperatorError
from aioinfer.opsets import node_opset
from aioinfer.transforms.make_stateful import ASSIGN, READ_VALUE, STATE_DOMAIN


def evaluate_node(
    node: ir.Node, opset: int, inputs: Sequence[np.ndarray | None]
) -> Sequence[np.ndarray]:
    """Run one node on known inputs (constant folding uses this)."""
    entry = find_kernel(node.domain, node.op_type, opset, node.name or "")
    kernel = entry.factory(make_spec(node, opset, inputs))
    return kernel(*inputs)


def constant_array(value: ir.Value) -> np.ndarray:
    """The read-only array of an initializer, shared by every request."""
    assert value.const_value is not None
    array = np.asarray(value.const_value.numpy())
    array.flags.writeable = False
    return array


def subgraphs(node: ir.Node) -> dict[str, ir.Graph]:
    """The graph attributes of ``node`` (the bodies of If, Loop, Scan, SequenceMap)."""
    return {
        name: attr.value
        for name, attr in node.attributes.items()
        if attr.type == ir.AttributeType.GRAPH
    }


def captured_values(graphs: Sequence[ir.Graph]) -> list[ir.Value]:
    """The values ``graphs`` (or graphs nested in them) read from an enclosing scope,
    in order of first use."""
    defined: set[ir.Value] = set()
    used: dict[ir.Value, None] = {}

    def visit(graph: ir.Graph) -> None:
        defined.update(graph.inputs)
        defined.update(graph.initializers.values())
        for node in graph:
            used.update(dict.fromkeys(v for v in node.inputs if v is not None))
            for sub in subgraphs(node).values():
                visit(sub)
            defined.update(node.outputs)
        used.update(dict.fromkeys(graph.outputs))

    for graph in graphs:
        visit(graph)
    return [v for v in used if v not in defined]


def lower(graph: ir.Graph, opsets: dict[str, int], captured: Sequence[ir.Value] = ()) -> Plan:
    """Bind a kernel to every node of the (topologically sorted) ``graph``.

    ``captured`` lists values of enclosing graphs that a subgraph reads: the plan takes
    them as extra inputs after the graph's own. A node with subgraphs gets their plans
    (``NodeSpec.subplans``, each taking its graph's inputs then the node's captured
    values) and reads those captured values as extra inputs after its own.

    The state ops of make-stateful become plan I/O rather than kernels: each variable's
    ReadValue value is an input after the others, its Assign value an output after the
    graph's own, in the order of ``Plan.variables``.

    Raises:
        UnsupportedOperatorError: no kernel for a node (the message names it).
        CompileError: a kernel rejected its node's attributes.
    """
    slots: dict[ir.Value, int] = {}

    def slot_of(value: ir.Value) -> int:
        if value not in slots:
            slots[value] = len(slots) + 2
        return slots[value]

    arrays = {v: constant_array(v) for v in graph.initializers.values()}
    constants = [(slot_of(v), array) for v, array in arrays.items()]
    feeds = [v for v in graph.inputs if v.name not in graph.initializers]
    input_slots = tuple(slot_of(v) for v in (*feeds, *captured))

    nodes = list(graph)
    bound: list[Step] = []
    reads: dict[str, int] = {}
    assigns: dict[str, int] = {}
    for node in nodes:
        if node.domain == STATE_DOMAIN and node.op_type in (READ_VALUE, ASSIGN):
            variable = node.attributes["variable_id"].as_string()
            if node.op_type == READ_VALUE:
                reads[variable] = slot_of(node.outputs[0])
            else:
                assigns[variable] = slot_of(node.inputs[0])  # type: ignore[arg-type]
            continue
        opset = node_opset(node, opsets)
        const_inputs = [None if v is None else arrays.get(v) for v in node.inputs]
        name = node.name or f"{node.op_type}_{len(bound)}"
        entry = find_kernel(node.domain, node.op_type, opset, name)
        bodies = subgraphs(node)
        outer = captured_values(list(bodies.values()))
        subplans = {key: lower(body, opsets, outer) for key, body in bodies.items()}
        try:
            spec = make_spec(node, opset, const_inputs, subplans)
            kernel = entry.factory(spec)
            out_factory = find_out_kernel(entry)
            out_form = None if out_factory is None else out_factory(spec)
        except UnsupportedOperatorError:
            raise
        except Exception as exc:
            raise CompileError(
                f"node {name!r} ({node.op_type}, opset {opset}) cannot be compiled: {exc}"
            ) from exc
        ins = tuple(NONE_SLOT if v is None else slot_of(v) for v in (*node.inputs, *outer))
        outs = tuple(SCRATCH_SLOT if not v.name else slot_of(v) for v in node.outputs)
        step = Step(
            kernel, ins, outs, (), name, node.op_type, entry.execution_type, out_form, subplans
        )
        bound.append(step)

    variables = tuple(reads)
    input_slots += tuple(reads[v] for v in variables)
    output_slots = tuple(slot_of(v) for v in graph.outputs)
    output_slots += tuple(assigns[v] for v in variables)
    pinned = set(output_slots) | {s for s, _ in constants} | {NONE_SLOT, SCRATCH_SLOT}
    free = releases([(step.inputs, step.outputs) for step in bound], pinned)
    steps = [replace(step, release=release) for step, release in zip(bound, free)]
    return Plan(
        num_slots=len(slots) + 2,
        constants=tuple(constants),
        input_slots=input_slots,
        output_slots=output_slots,
        steps=tuple(steps),
        variables=variables,
    )
