"""Grouped-query attention without repeating the cache: query heads grouped per KV head.

A grouped-query decoder (Llama with fewer KV heads than query heads) exported by optimum
repeats each KV head for its group of query heads before the attention ``MatMul``s
(transformers' ``repeat_kv``), which copies the whole cache at every step, keys and
values, twice over for 8 query heads on 4 KV heads. This pass groups the query heads
instead, so each ``MatMul`` reads the cache as it is::

    before:  kv [b, kv, L, d] -> Unsqueeze(2) -> Expand [b, kv, g, L, d] -> Reshape [b, kv*g, L, d]
             scores = q [b, kv*g, s, d] @ Transpose(kv')   out = probs [b, kv*g, s, L] @ kv'
    after:   scores = Reshape(q, [b, kv, g*s, d]) @ Transpose(kv) -> Reshape [b, kv*g, s, L]
             out = Reshape(probs, [b, kv, g*s, L]) @ kv -> Reshape [b, kv*g, s, d]

Head ``h`` of the repeated cache is KV head ``h // g``, and ``[b, kv*g, s, x]`` is
``[b, kv, g*s, x]`` in the same order, so every product is the same sum. The repeated
cache may reach its ``MatMul`` through a ``Transpose`` of the last two axes and a ``Mul``
by a scalar (the keys, scaled); its shape may be read (``Shape`` then ``Gather`` of an
axis other than the heads). A repeat used otherwise is left as it is.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from aioinfer.model import Model
from aioinfer.transforms.rewrite import initializer, is_op


def grouped_query_attention(model: Model) -> Model:
    """A copy of the decoder ``model`` whose attention reads each KV head once for its
    group of query heads instead of repeating the cache (see the module); the same
    numbers, sharing the weights. A model without such a repeat (multi-head attention)
    comes back unchanged in a copy."""
    copy = model.ir.clone()
    GroupedAttentionPass()(copy)
    return Model(copy)


SHAPE_SLICE_OPSET = 15
"""``Shape``'s ``start`` and ``end`` attributes, which the reshape back reads."""


class GroupedAttentionPass(ir.passes.InPlacePass):
    """Group the query heads instead of repeating the KV heads (see the module)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model.opset_imports.get("", 0) < SHAPE_SLICE_OPSET:
            return ir.passes.PassResult(model, modified=False)
        graph = model.graph
        modified = False
        for node in list(graph):
            if is_op(node, "Expand") and _group(graph, node):
                modified = True
        if modified:
            RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified=modified)


def _group(graph: ir.Graph, expand: ir.Node) -> bool:
    """Rewrite the readers of one repeated cache; False (nothing changed) when it is not
    ``repeat_kv`` or a reader is not one of the known kinds."""
    unsqueeze = expand.inputs[0].producer() if expand.inputs[0] is not None else None
    if not is_op(unsqueeze, "Unsqueeze") or _ints(unsqueeze, "axes") != [2]:
        return False
    cache = unsqueeze.inputs[0]
    if cache is None or cache.shape is None or len(cache.shape) != 4:
        return False
    heads = cache.shape[1]
    reshape = _only_reader(expand.outputs[0])
    if not isinstance(heads, int) or not is_op(reshape, "Reshape"):
        return False
    if not _merges_the_heads(reshape, heads):
        return False
    readers = []
    for reader, index in reshape.outputs[0].uses():
        kind = _reader_kind(reader, index)
        if kind is None:
            return False
        readers.append((kind, reader))
    groups = initializer(graph, f"{expand.name}/grouped", np.array([0, heads, -1, 0], np.int64))
    for kind, reader in readers:
        if kind == "shape":
            reader.replace_input_with(0, cache)
        elif kind == "values":
            _grouped_matmul(graph, reader, groups)
            reader.replace_input_with(1, cache)
        else:  # the keys: Transpose -> Mul -> MatMul
            reader.replace_input_with(0, cache)
            scale = _only_reader(reader.outputs[0])
            assert scale is not None
            matmul = _only_reader(scale.outputs[0])
            assert matmul is not None
            _grouped_matmul(graph, matmul, groups)
    return True


def _reader_kind(reader: ir.Node, index: int) -> str | None:
    """How a node reads the repeated cache: ``shape`` (its shape, heads not read),
    ``values`` (the right operand of a MatMul), ``keys`` (transposed and scaled into
    one), else None."""
    if is_op(reader, "Shape") and not reader.attributes:
        gathers = [user for user, _ in reader.outputs[0].uses()]
        axes = [_gathered_axis(user) for user in gathers]
        if gathers and all(axis is not None and axis not in (1, -3) for axis in axes):
            return "shape"
        return None
    if is_op(reader, "MatMul") and index == 1:
        return "values"
    if is_op(reader, "Transpose") and _ints(reader, "perm") == [0, 1, 3, 2]:
        scale = _only_reader(reader.outputs[0])
        if not is_op(scale, "Mul") or _scalar_operand(scale, reader.outputs[0]) is None:
            return None
        assert scale is not None
        matmul = _only_reader(scale.outputs[0])
        if is_op(matmul, "MatMul") and matmul.inputs[1] is scale.outputs[0]:
            return "keys"
    return None


def _grouped_matmul(graph: ir.Graph, matmul: ir.Node, groups: ir.Value) -> None:
    """Feed ``matmul`` its left operand grouped ``[b, kv, g*s, x]`` and give its readers
    the product reshaped back to ``[b, kv*g, s, y]``."""
    left, result = matmul.inputs[0], matmul.outputs[0]
    assert left is not None
    stem = matmul.name or "matmul"
    grouped = ir.node("Reshape", [left, groups], name=f"{stem}/grouped")
    leading = ir.node("Shape", [left], attributes={"start": 0, "end": 3}, name=f"{stem}/lead")
    graph.insert_before(matmul, [grouped, leading])
    matmul.replace_input_with(0, grouped.outputs[0])
    trailing = ir.node("Shape", [result], attributes={"start": 3}, name=f"{stem}/trail")
    shape = ir.node("Concat", [leading.outputs[0], trailing.outputs[0]], {"axis": 0})
    ungrouped = ir.Value(shape=result.shape, type=result.type)
    back = ir.Node("", "Reshape", [result, shape.outputs[0]], outputs=[ungrouped])
    # The product reshaped back takes the product's readers, graph output and name.
    name = result.name
    result.replace_all_uses_with(ungrouped, replace_graph_outputs=True)
    back.replace_input_with(0, result)
    trailing.replace_input_with(0, result)
    result.name, result.shape = f"{stem}/grouped_product", None
    ungrouped.name = name
    graph.insert_after(matmul, [trailing, shape, back])


def _merges_the_heads(reshape: ir.Node, heads: int) -> bool:
    """Whether ``reshape`` makes ``[b, kv * g, L, d]`` of ``[b, kv, g, L, d]`` as
    ``repeat_kv`` exports it: its shape is a ``Concat`` of four parts whose second is the
    heads times the group (a constant multiple of ``heads`` above it, or a ``Mul`` of a
    ``Gather`` of axis 1 of a shape); any other reshape is left alone."""
    shape = reshape.inputs[1].producer() if reshape.inputs[1] is not None else None
    if not is_op(shape, "Concat") or len(shape.inputs) != 4:
        return False
    merged = _through_unsqueeze(shape.inputs[1])
    known = _known(merged)
    if known is not None:
        merged_heads = int(known.reshape(-1)[0]) if known.size == 1 else 0
        return merged_heads > heads and merged_heads % heads == 0
    product = merged.producer() if merged is not None else None
    if not is_op(product, "Mul"):
        return False
    return any(
        _gathered_axis(operand.producer()) == 1
        for operand in product.inputs
        if operand is not None and operand.producer() is not None
    )


def _through_unsqueeze(value: ir.Value | None) -> ir.Value | None:
    node = value.producer() if value is not None else None
    return node.inputs[0] if is_op(node, "Unsqueeze") else value


def _only_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0][0] if len(uses) == 1 and not value.is_graph_output() else None


def _known(value: ir.Value | None) -> np.ndarray | None:
    """The value of an initializer or of a ``Constant`` node's output, else None."""
    if value is None:
        return None
    if value.const_value is not None:
        return np.asarray(value.const_value.numpy())
    node = value.producer()
    if is_op(node, "Constant") and "value" in node.attributes:
        return np.asarray(node.attributes["value"].as_tensor().numpy())
    return None


def _ints(node: ir.Node, name: str) -> list[int] | None:
    """An ints attribute of ``node``, or (``axes`` since opset 13) its second input."""
    if name in node.attributes:
        return [int(v) for v in node.attributes[name].as_ints()]
    if name == "axes" and len(node.inputs) > 1:
        known = _known(node.inputs[1])
        return None if known is None else [int(v) for v in known.reshape(-1)]
    return None


def _gathered_axis(node: ir.Node | None) -> int | None:
    """The index a ``Gather`` along axis 0 takes, when it is a constant scalar."""
    if not is_op(node, "Gather"):
        return None
    axis = node.attributes.get("axis")
    if axis is not None and axis.as_int() != 0:
        return None
    index = _known(node.inputs[1])
    return int(index.reshape(())) if index is not None and index.size == 1 else None


def _scalar_operand(node: ir.Node, value: ir.Value) -> np.ndarray | None:
    other = node.inputs[1] if node.inputs[0] is value else node.inputs[0]
    known = _known(other)
    return known if known is not None and known.size == 1 else None
