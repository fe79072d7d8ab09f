"""Lowering: an IR graph becomes a :class:`Plan` of bound kernels over numbered slots."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu.kernels.registry import Kernel, find_kernel, make_spec
from aioinfer.devices.cpu.plan import NONE_SLOT, SCRATCH_SLOT, Plan, Step
from aioinfer.errors import CompileError, UnsupportedOperatorError


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


def lower(graph: ir.Graph, opsets: dict[str, int]) -> Plan:
    """Bind a kernel to every node of the (topologically sorted) ``graph``.

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
    input_slots = tuple(slot_of(v) for v in graph.inputs if v.name not in graph.initializers)

    nodes = list(graph)
    bound: list[tuple[ir.Node, str, Kernel, tuple[int, ...], tuple[int, ...], str]] = []
    for node in nodes:
        opset = opsets.get(node.domain, opsets.get("", 1))
        const_inputs = [None if v is None else arrays.get(v) for v in node.inputs]
        name = node.name or f"{node.op_type}_{len(bound)}"
        entry = find_kernel(node.domain, node.op_type, opset, name)
        try:
            kernel = entry.factory(make_spec(node, opset, const_inputs))
        except UnsupportedOperatorError:
            raise
        except Exception as exc:
            raise CompileError(
                f"node {name!r} ({node.op_type}, opset {opset}) cannot be compiled: {exc}"
            ) from exc
        ins = tuple(NONE_SLOT if v is None else slot_of(v) for v in node.inputs)
        outs = tuple(SCRATCH_SLOT if not v.name else slot_of(v) for v in node.outputs)
        bound.append((node, name, kernel, ins, outs, entry.execution_type))

    output_slots = tuple(slot_of(v) for v in graph.outputs)
    pinned = set(output_slots) | {s for s, _ in constants} | {NONE_SLOT, SCRATCH_SLOT}
    last_use: dict[int, int] = {}
    for index, (_, _, _, ins, outs, _) in enumerate(bound):
        for slot in (*ins, *outs):
            last_use[slot] = index
    steps = []
    for index, (node, name, kernel, ins, outs, execution_type) in enumerate(bound):
        release = tuple(
            sorted({s for s in (*ins, *outs) if last_use[s] == index and s not in pinned})
        )
        steps.append(Step(kernel, ins, outs, release, name, node.op_type, execution_type))
    return Plan(
        num_slots=len(slots) + 2,
        constants=tuple(constants),
        input_slots=input_slots,
        output_slots=output_slots,
        steps=tuple(steps),
    )
