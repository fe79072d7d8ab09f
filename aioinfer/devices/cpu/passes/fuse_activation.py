"""Fuse biases, residual Adds and activations into the Conv/Gemm/MatMul that feeds them.

- ``Add(Conv(x, W), b)`` with a constant per-channel ``b`` (shape ``[C, 1, ...]`` or
  ``[1, C, 1, ...]``) moves ``b`` into the Conv's bias.
- ``Add(Conv(...), z)`` (a residual connection, as in ResNets; also a two-input ``Sum``)
  becomes ``ai.aioinfer::FusedConv(x, W, B, z)``: the sum is added in place.
- ``Mul(Conv(x, W, B), s)`` with a constant scalar ``s`` scales W and B; with
  ``Add(..., t)`` for a constant scalar ``t`` after it, ``t`` joins the bias (PP-OCRv4's
  learnable affine after each convolution).
- ``Relu``/``LeakyRelu``/``Clip``/``Sigmoid``/``Tanh``/``Gelu`` (erf or tanh)/``HardSigmoid``/
  ``HardSwish`` after a Conv, Gemm or MatMul (or their fused forms) becomes the ``activation``
  attribute of ``FusedConv``/``FusedGemm``/``FusedMatMul``, applied in place on the
  product. So do the decomposed forms exporters write: HardSwish as
  ``x * HardSigmoid(x)`` (its constants) or as ``x * Clip(x + 3, 0, 6) / 6`` (Paddle's
  four nodes, also with ``* (1/6)``), and SiLU ``x * Sigmoid(x)`` (as ``Swish``; YOLO
  exports). A ``Max`` with a constant after a LeakyRelu (TensorFlow's clipped leaky ReLU)
  joins it as a floor. Unfused, each of these is two to four full passes over a convolution's
  output: on PicoDet's layout model 52 of 437 ms.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    grows_rank,
    initializer,
    is_op,
    other_input,
    producer,
    replace,
    scalar,
    single_use,
)

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)
_FUSED_OF = {"Conv": ops.FUSED_CONV, "Gemm": ops.FUSED_GEMM, "MatMul": ops.FUSED_MATMUL}
_FUSED = tuple(op.name for op in _FUSED_OF.values())


def _activation(node: ir.Node) -> tuple[ops.Activation, list[float]] | None:
    """The activation ``node`` computes (name, parameters), if the fused kernels have it."""
    if is_op(node, "Relu", "Sigmoid", "Tanh"):
        return ops.Activation(node.op_type), []
    if is_op(node, "Gelu") or ops.GELU.matches(node):
        approximate = ops.APPROXIMATE.of(node)  # the same attribute as ONNX Gelu's
        form = "none" if approximate is None else approximate.as_string()
        forms = {"none": ops.Activation.GELU, "tanh": ops.Activation.GELU_TANH}
        return None if form not in forms else (forms[form], [])
    if is_op(node, "LeakyRelu"):
        alpha = node.attributes.get("alpha")
        return ops.Activation.LEAKY_RELU, [0.01 if alpha is None else alpha.as_float()]
    if is_op(node, "HardSigmoid"):
        alpha, beta = node.attributes.get("alpha"), node.attributes.get("beta")
        return ops.Activation.HARD_SIGMOID, [
            0.2 if alpha is None else alpha.as_float(),
            0.5 if beta is None else beta.as_float(),
        ]
    if is_op(node, "HardSwish"):
        return ops.Activation.HARD_SWISH, []
    if is_op(node, "Clip"):
        if "min" in node.attributes or "max" in node.attributes:  # opset < 11
            low_attr = node.attributes.get("min")
            high_attr = node.attributes.get("max")
            return ops.Activation.CLIP, [
                float(np.finfo(np.float32).min) if low_attr is None else low_attr.as_float(),
                float(np.finfo(np.float32).max) if high_attr is None else high_attr.as_float(),
            ]
        bounds = [*node.inputs[1:3], None, None][:2]
        values = [scalar(v) if v is not None else None for v in bounds]
        if any(v is None and b is not None for v, b in zip(values, bounds)):
            return None
        low, high = values
        return ops.Activation.CLIP, [
            float(np.finfo(np.float32).min) if low is None else low,
            float(np.finfo(np.float32).max) if high is None else high,
        ]
    return None


def _fusable(node: ir.Node | None) -> bool:
    """A Conv/Gemm/MatMul (or fused form without an activation) with a float output."""
    if node is None or node.outputs[0].dtype not in (None, *_FLOATS):
        return False
    if is_op(node, *_FUSED_OF):
        return True
    return is_op(node, *_FUSED, domain=ops.DOMAIN) and ops.ACTIVATION.of(node) is None


def _only_source(x: ir.Value, readers: set[int]) -> ir.Node | None:
    """The fusable product that computes ``x``, when exactly the nodes ``readers`` (by id)
    read ``x`` and it is no graph output; else None."""
    source = x.producer()
    if not _fusable(source) or x.is_graph_output():
        return None
    if {id(user) for user, _ in x.uses()} != readers:
        return None
    return source


def _fused_node(source: ir.Node, inputs: list[ir.Value | None], extra: list[ir.Attr]) -> ir.Node:
    op = _FUSED_OF.get(source.op_type) or ops.OPS[source.op_type]
    attrs = {a.name: a for a in source.attributes.values()}
    attrs.update({a.name: a for a in extra})
    return op.node(inputs, attrs.values(), name=source.name)


class FuseActivationPass(RewritePass):
    """Biases, residual sums and activations go into the product that feeds them."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if is_op(node, "Add", "Sum") and len(node.inputs) == 2:
            return self._add(graph, node)
        if is_op(node, "Mul") and len(node.inputs) == 2:
            return (
                self._hard_swish(graph, node)
                or self._swish(graph, node)
                or self._scaled_conv(graph, node)
                or self._hard_swish_clipped(graph, node)
            )
        if is_op(node, "Div") and len(node.inputs) == 2:
            return self._hard_swish_clipped(graph, node)
        if is_op(node, "Max") and len(node.inputs) == 2:
            return self._floored_leaky_relu(graph, node)
        act = _activation(node)
        if act is None:
            return False
        source = node.inputs[0].producer() if node.inputs[0] is not None else None
        if not _fusable(source) or not single_use(node.inputs[0]):
            return False
        assert source is not None
        name, params = act
        extra = [ops.ACTIVATION(name)]
        if params:
            extra.append(ops.ACTIVATION_PARAMS(params))
        replace(
            graph, [source, node], _fused_node(source, list(source.inputs), extra), node.outputs[0]
        )
        return True

    def _add(self, graph: ir.Graph, node: ir.Node) -> bool:
        for index in (0, 1):
            value, other = node.inputs[index], node.inputs[1 - index]
            conv = producer(value, "Conv") or ops.FUSED_CONV.producer(value)
            if conv is None or not single_use(value) or other is value or not _fusable(conv):
                continue
            if len(conv.inputs) > 3:  # already has a residual
                continue
            inputs = [*conv.inputs, None, None][:3]
            bias = self._channel_bias(graph, conv, inputs[2], other)
            if bias is not None:
                inputs[2] = bias
                fused = (
                    _fused_node(conv, inputs, [])
                    if ops.FUSED_CONV.matches(conv)
                    else ir.Node(
                        "",
                        "Conv",
                        inputs,
                        list(conv.attributes.values()),
                        num_outputs=1,
                        name=conv.name,
                    )
                )
            else:
                fused = _fused_node(conv, [*inputs, other], [])
            replace(graph, [conv, node], fused, node.outputs[0])
            return True
        return False

    @staticmethod
    def _hard_swish(graph: ir.Graph, node: ir.Node) -> bool:
        """``Mul(x, HardSigmoid(x, 1/6, 1/2))`` (HardSwish as exported before opset 14)
        with ``x`` from a fusable product: the product with a HardSwish epilogue."""
        for index in (0, 1):
            x, gate = node.inputs[index], node.inputs[1 - index]
            hard_sigmoid = producer(gate, "HardSigmoid")
            if hard_sigmoid is None or hard_sigmoid.inputs[0] is not x or not single_use(gate):
                continue
            act = _activation(hard_sigmoid)
            assert x is not None and act is not None
            if not np.allclose(act[1], [1 / 6, 0.5], rtol=1e-6, atol=0):
                continue
            source = x.producer()
            readers = {id(user) for user, _ in x.uses()}
            if (
                not _fusable(source)
                or x.is_graph_output()
                or readers != {id(hard_sigmoid), id(node)}
            ):
                continue
            assert source is not None
            extra = [ops.ACTIVATION(ops.Activation.HARD_SWISH)]
            fused = _fused_node(source, list(source.inputs), extra)
            replace(graph, [source, hard_sigmoid, node], fused, node.outputs[0])
            return True
        return False

    @staticmethod
    def _swish(graph: ir.Graph, node: ir.Node) -> bool:
        """``Mul(x, Sigmoid(x))`` with ``x`` from a fusable product: a Swish epilogue."""
        for index in (0, 1):
            x, gate = node.inputs[index], node.inputs[1 - index]
            sigmoid = producer(gate, "Sigmoid")
            if sigmoid is None or sigmoid.inputs[0] is not x or not single_use(gate):
                continue
            assert x is not None
            source = _only_source(x, {id(sigmoid), id(node)})
            if source is None:
                continue
            extra = [ops.ACTIVATION(ops.Activation.SWISH)]
            fused = _fused_node(source, list(source.inputs), extra)
            replace(graph, [source, sigmoid, node], fused, node.outputs[0])
            return True
        return False

    @staticmethod
    def _hard_swish_clipped(graph: ir.Graph, node: ir.Node) -> bool:
        """``Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)`` (or ``Mul(..., 1/6)``), operands in
        either order, with ``x`` from a fusable product: a HardSwish epilogue."""
        if is_op(node, "Div"):
            candidates = [(node.inputs[0], node.inputs[1], 6.0)]
        else:
            candidates = [(node.inputs[i], node.inputs[1 - i], 1 / 6) for i in (0, 1)]
        for product, divisor, wanted in candidates:
            factor = scalar(divisor)
            mul = producer(product, "Mul")
            if factor is None or not np.isclose(factor, wanted, rtol=1e-6, atol=0):
                continue
            if mul is None or not single_use(product):
                continue
            for index in (0, 1):
                x, gate = mul.inputs[index], mul.inputs[1 - index]
                clip = producer(gate, "Clip")
                if (
                    clip is None
                    or not single_use(gate)
                    or _activation(clip) != (ops.Activation.CLIP, [0, 6])
                ):
                    continue
                shifted = clip.inputs[0]
                add = producer(shifted, "Add")
                if add is None or not single_use(shifted) or x not in add.inputs:
                    continue
                three = other_input(add, x)
                if scalar(three) != 3.0 or x is None:
                    continue
                source = _only_source(x, {id(add), id(mul)})
                if source is None:
                    continue
                extra = [ops.ACTIVATION(ops.Activation.HARD_SWISH)]
                fused = _fused_node(source, list(source.inputs), extra)
                replace(graph, [source, add, clip, mul, node], fused, node.outputs[0])
                return True
        return False

    @staticmethod
    def _floored_leaky_relu(graph: ir.Graph, node: ir.Node) -> bool:
        """``Max(y, c)`` with a constant scalar ``c`` and ``y`` a product whose
        activation is a LeakyRelu of slope in [0, 1] (TensorFlow's clipped leaky ReLU,
        in openWakeWord's embedding after each of its 19 convolutions): ``c`` joins the
        activation's parameters as a floor, applied on the product as it is made."""
        for index in (0, 1):
            value, floor = node.inputs[index], node.inputs[1 - index]
            source = producer(value, *_FUSED, domain=ops.DOMAIN)
            bound = scalar(floor)
            array = constant(floor)
            if source is None or bound is None or array is None or not single_use(value):
                continue
            if grows_rank(array, value):
                continue  # the Max would grow the product's rank
            name = ops.ACTIVATION.of(source)
            params = ops.ACTIVATION_PARAMS.of(source)
            if name is None or name.as_string() != ops.Activation.LEAKY_RELU or params is None:
                continue
            alphas = list(params.as_floats())
            if len(alphas) != 1 or not 0 <= alphas[0] <= 1:
                continue
            extra = [ops.ACTIVATION_PARAMS([alphas[0], bound])]
            fused = _fused_node(source, list(source.inputs), extra)
            replace(graph, [source, node], fused, node.outputs[0])
            return True
        return False

    @staticmethod
    def _scaled_conv(graph: ir.Graph, node: ir.Node) -> bool:
        """``Mul(Conv(x, W, B), s)`` with constant W (and B) and a constant scalar ``s``:
        the Conv with ``s * W`` and ``s * B``."""
        for index in (0, 1):
            value, factor_value = node.inputs[index], node.inputs[1 - index]
            conv = producer(value, "Conv")
            factor_array = constant(factor_value)
            if conv is None or factor_array is None or not single_use(value):
                continue
            if factor_array.size != 1 or factor_array.ndim > 1 or factor_array.dtype.kind != "f":
                continue
            factor = float(factor_array.reshape(()))
            weight = constant(conv.inputs[1])
            bias = conv.inputs[2] if len(conv.inputs) > 2 else None
            bias_values = None if bias is None else constant(bias)
            if (
                weight is None
                or weight.dtype.kind != "f"
                or (bias is not None and bias_values is None)
            ):
                continue
            name = conv.name or "conv"
            inputs = [
                conv.inputs[0],
                initializer(graph, f"{name}.scaled_weight", (weight * factor).astype(weight.dtype)),
            ]
            if bias_values is not None:
                scaled = (bias_values * factor).astype(bias_values.dtype)
                inputs.append(initializer(graph, f"{name}.scaled_bias", scaled))
            fused = ir.Node(
                "", "Conv", inputs, list(conv.attributes.values()), num_outputs=1, name=conv.name
            )
            replace(graph, [conv, node], fused, node.outputs[0])
            return True
        return False

    @staticmethod
    def _channel_bias(
        graph: ir.Graph, conv: ir.Node, old: ir.Value | None, added: ir.Value | None
    ) -> ir.Value | None:
        """A new bias input when ``added`` is a constant per-output-channel bias."""
        values, weight = constant(added), constant(conv.inputs[1])
        if values is None or weight is None:
            return None
        channels = weight.shape[0]
        rank = weight.ndim  # the output's rank equals the weight's rank
        shape = values.shape
        per_channel = (
            (len(shape) == rank - 1 and shape[0] == channels and values.size == channels)
            or (len(shape) == rank and shape[:2] == (1, channels) and values.size == channels)
            or (values.size == 1 and len(shape) <= rank)  # a scalar: the same for each
        )
        if not per_channel:
            return None
        base = np.zeros(channels) if old is None else constant(old)
        if base is None:
            return None
        total = base.astype(np.float64).reshape(-1) + values.astype(np.float64).reshape(-1)
        total = np.broadcast_to(total, (channels,))
        return initializer(graph, f"{conv.name or 'conv'}.bias", total.astype(weight.dtype))
