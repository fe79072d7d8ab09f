"""Fold an inference BatchNormalization into the Conv or Gemm that feeds it.

``BN(conv(x, W, B))`` with constant parameters is ``conv(x, W * s, B * s + t)`` for
``s = scale / sqrt(var + epsilon)`` and ``t = bias - mean * s`` per output channel; for
Gemm (channels on axis 1 of its 2-D output) the columns of ``B'`` are scaled the same way
and ``C`` becomes ``beta * C * s + t``. Computed in float64, stored in the weight's dtype.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    initializer,
    is_op,
    producer,
    replace,
    single_use,
)


def _inference_mode(node: ir.Node) -> bool:
    training = node.attributes.get("training_mode")
    if training is not None and training.as_int():
        return False
    spatial = node.attributes.get("spatial")
    if spatial is not None and spatial.as_int() == 0:
        return False
    # Extra outputs (running or saved statistics) mean training in every opset.
    return all(not v.name or not list(v.uses()) for v in node.outputs[1:])


class FoldBatchNormPass(RewritePass):
    """``Conv``/``Gemm`` followed by an inference ``BatchNormalization`` with constant
    parameters becomes one ``Conv``/``Gemm`` with rescaled weights."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not is_op(node, "BatchNormalization") or len(node.inputs) != 5:
            return False
        source = producer(node.inputs[0], "Conv", "Gemm")
        if source is None or not single_use(node.inputs[0]) or not _inference_mode(node):
            return False
        params = [constant(v) for v in node.inputs[1:]]
        weight = constant(source.inputs[1])
        if weight is None or any(p is None for p in params):
            return False
        scale, bias, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
        epsilon = node.attributes["epsilon"].as_float() if "epsilon" in node.attributes else 1e-5
        s = scale / np.sqrt(var + epsilon)
        t = bias - mean * s
        if source.op_type == "Conv":
            inputs = self._conv(graph, source, weight, s, t)
        else:
            inputs = self._gemm(graph, source, weight, s, t)
        if inputs is None:
            return False
        folded = ir.Node(
            "",
            source.op_type,
            inputs,
            list(source.attributes.values()),
            num_outputs=1,
            name=source.name,
        )
        replace(graph, [source, node], folded, node.outputs[0])
        return True

    @staticmethod
    def _conv(
        graph: ir.Graph, conv: ir.Node, weight: np.ndarray, s: np.ndarray, t: np.ndarray
    ) -> list[ir.Value | None] | None:
        if weight.shape[0] != s.size:
            return None
        old_bias = constant(conv.inputs[2]) if len(conv.inputs) > 2 else None
        if len(conv.inputs) > 2 and conv.inputs[2] is not None and old_bias is None:
            return None
        b = np.zeros(s.size) if old_bias is None else old_bias.astype(np.float64).reshape(-1)
        w = weight.astype(np.float64) * s.reshape((-1,) + (1,) * (weight.ndim - 1))
        name = conv.name or "conv"
        return [
            conv.inputs[0],
            initializer(graph, f"{name}.folded_weight", w.astype(weight.dtype)),
            initializer(graph, f"{name}.folded_bias", (b * s + t).astype(weight.dtype)),
        ]

    @staticmethod
    def _gemm(
        graph: ir.Graph, gemm: ir.Node, weight: np.ndarray, s: np.ndarray, t: np.ndarray
    ) -> list[ir.Value | None] | None:
        attrs = gemm.attributes
        trans_b = attrs["transB"].as_int() if "transB" in attrs else 0
        beta = attrs["beta"].as_float() if "beta" in attrs else 1.0
        columns = weight.shape[0] if trans_b else weight.shape[-1]
        if weight.ndim != 2 or columns != s.size or beta == 0.0:
            return None
        c = constant(gemm.inputs[2]) if len(gemm.inputs) > 2 else None
        if len(gemm.inputs) > 2 and gemm.inputs[2] is not None and c is None:
            return None
        w = weight.astype(np.float64) * (s.reshape(-1, 1) if trans_b else s.reshape(1, -1))
        new_c = t if c is None else beta * c.astype(np.float64) * s + t
        # beta now multiplies the folded C: undo it so that beta * C' is what we computed.
        new_c = new_c / beta
        name = gemm.name or "gemm"
        return [
            gemm.inputs[0],
            initializer(graph, f"{name}.folded_weight", w.astype(weight.dtype)),
            initializer(graph, f"{name}.folded_bias", new_c.astype(weight.dtype)),
        ]
