"""Run one ONNX node through aioinfer and through ``onnx.reference`` and compare."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator

from aioinfer.devices.cpu import kernels  # noqa: F401  (registers the families)
from aioinfer.devices.cpu.kernels.registry import find_kernel, make_spec


def run_aioinfer(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int
) -> list[np.ndarray]:
    """Run ``node`` on ``inputs`` through the CPU device's kernel for it."""
    ir_node = ir.from_proto(node)
    entry = find_kernel(ir_node.domain, ir_node.op_type, opset, ir_node.name)
    fn = entry.factory(make_spec(ir_node, opset))
    return list(fn(*inputs))


def run_reference(
    node: onnx.NodeProto, inputs: Sequence[np.ndarray | None], opset: int
) -> list[np.ndarray]:
    """Run ``node`` on ``inputs`` through the onnx package's reference evaluator."""
    names = [n for n in node.input]
    feeds = {n: x for n, x in zip(names, inputs) if n and x is not None}
    graph_inputs = [
        oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in feeds.items()
    ]
    graph_outputs = [oh.make_tensor_value_info(n, 0, None) for n in node.output if n]
    graph = oh.make_graph([node], "check", graph_inputs, graph_outputs)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    return list(ReferenceEvaluator(model).run(None, feeds))


def check_node(
    node: onnx.NodeProto,
    inputs: Sequence[np.ndarray | None],
    opset: int = 18,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    **_: Any,
) -> list[np.ndarray]:
    """Assert that aioinfer and onnx.reference agree on ``node``: dtype, shape and values."""
    got = run_aioinfer(node, inputs, opset)
    want = run_reference(node, inputs, opset)
    positions = [(i, n) for i, n in enumerate(node.output) if n]
    assert len(got) >= len(node.output), f"{node.op_type}: {len(got)} outputs"
    for (i, name), w in zip(positions, want):
        g = got[i]
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{node.op_type} {name}: dtype {g.dtype}, want {w.dtype}"
        assert g.shape == w.shape, f"{node.op_type} {name}: shape {g.shape}, want {w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{node.op_type} {name}")
    return got


def split_small_products(monkeypatch: Any) -> None:
    """Let products and their copies split between the intra-op threads from 64K
    multiply-adds on (the device waits for 16M), and Winograd's transforms from 4K
    elements (the device waits for 1M), and max pools' blocks of channels likewise, so
    that test-sized convolutions and pools take the split paths."""
    from aioinfer.devices.cpu.kernels import conv_flat, conv_rows, conv_winograd, matmul, pool

    for module in (conv_flat, conv_rows, matmul):
        monkeypatch.setattr(module, "MIN_PARALLEL_MACS", 1 << 16)
    monkeypatch.setattr(conv_winograd, "MIN_PARALLEL_ELEMENTS", 1 << 12)
    monkeypatch.setattr(pool, "MIN_PARALLEL_ELEMENTS", 1 << 10)


def check_from_threads(
    results_of: Callable[[int], list[np.ndarray]],
    want: list[np.ndarray],
    rtol: float,
    atol: float,
) -> None:
    """Call ``results_of(index)`` for every index of ``want`` at once, each on a thread of
    its own (as requests share a kernel), and check every result it gave against
    ``want[index]``."""
    results: dict[int, list[np.ndarray]] = {}

    def work(index: int) -> None:
        results[index] = results_of(index)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(want))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for index, expected in enumerate(want):
        for got in results[index]:
            np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
