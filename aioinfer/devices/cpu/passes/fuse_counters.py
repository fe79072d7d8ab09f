"""Fuse the one-element counter arithmetic that paddle2onnx writes in Loop bodies.

paddle2onnx computes ``i + 1`` of an int64 counter through float, once per use
(SLANet's decoder body: three times in each of its 501 iterations), and hands a Less's
condition back through int64. :class:`FuseCountersPass`

- turns ``Cast(Add(Cast(x, to=FLOAT), c), to=<integer>)`` (``x`` an integer, ``c`` a
  float32 constant of one element that does not grow ``x``'s shape) into
  ``ai.aioinfer::CastAdd(x)`` with ``offset`` c and ``to``: the same two conversions and
  the same float addition, in one step; chains of the same ``x``, ``c`` and ``to`` in a
  subgraph share one node (three steps each -> one step for all);
- removes ``Cast(Cast(b, to=T), to=BOOL)`` for a bool ``b`` and a numeric ``T`` (false
  and true come back as they were).

As in :mod:`.eliminate_noops`, a main graph's outputs keep their nodes (their names are
the model's API).
"""

from __future__ import annotations

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    constant,
    defined_in,
    fed_by,
    grows_rank,
    is_op,
    only_use,
    producer,
    replace,
)
from aioinfer.transforms.subgraphs import SUBGRAPH_KEY

"""The fused operator: ``CastAdd(x)`` with ``offset`` (float32) and ``to`` (an integer
TensorProto type): ``cast(float32(x) + offset, to)``."""

_INTEGERS = frozenset(
    {
        ir.DataType.INT8,
        ir.DataType.INT16,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.UINT8,
        ir.DataType.UINT16,
        ir.DataType.UINT32,
        ir.DataType.UINT64,
    }
)


def _cast_to(node: ir.Node | None) -> ir.DataType | None:
    """The target type of a Cast (without saturate or round_mode settings), else None."""
    if node is None or not is_op(node, "Cast") or set(node.attributes) != {"to"}:
        return None
    return ir.DataType(node.attributes["to"].as_int())


class FuseCountersPass(RewritePass):
    """Counter chains rooted at their last Cast become ``CastAdd`` nodes; bool round trips
    through a numeric type disappear."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        to = _cast_to(node)
        if to is None:
            return False
        if to == ir.DataType.BOOL:
            return self._round_trip(graph, node)
        if to in _INTEGERS:
            return self._cast_add(graph, node, to)
        return False

    @staticmethod
    def _round_trip(graph: ir.Graph, node: ir.Node) -> bool:
        inner = fed_by(node.inputs[0], node, "Cast")
        middle = _cast_to(inner)
        if inner is None or middle is None:
            return False
        source = inner.inputs[0]
        if source is None or source.dtype != ir.DataType.BOOL or middle == ir.DataType.STRING:
            return False
        output = node.outputs[0]
        if output.is_graph_output() and (
            not graph.meta.get(SUBGRAPH_KEY, False)
            or source.is_graph_output()
            or not defined_in(source, graph)
        ):
            return False
        output.replace_all_uses_with(source, replace_graph_outputs=True)
        graph.remove([node, inner], safe=True)
        return True

    @staticmethod
    def _cast_add(graph: ir.Graph, node: ir.Node, to: ir.DataType) -> bool:
        summed = node.inputs[0]
        add = fed_by(summed, node, "Add")
        if add is None or len(add.inputs) != 2:
            return False
        casts = [
            (cast, widened, offset)
            for widened, offset in (add.inputs, add.inputs[::-1])
            if _cast_to(cast := producer(widened, "Cast")) == ir.DataType.FLOAT
        ]
        if not casts:
            return False
        cast, widened, offset = casts[0]
        assert cast is not None
        x = cast.inputs[0]
        array = constant(offset)
        if x is None or x.dtype not in _INTEGERS or x.shape is None or array is None:
            return False
        if only_use(widened) is not add or array.dtype.name != "float32" or array.size != 1:
            return False
        if grows_rank(array, x):
            return False  # the sum would have more axes than x
        value = float(array.reshape(()))
        output = node.outputs[0]
        twin = FuseCountersPass._twin(graph, node, x, value, to)
        if twin is not None and (
            graph.meta.get(SUBGRAPH_KEY, False) or not output.is_graph_output()
        ):
            output.replace_all_uses_with(twin.outputs[0], replace_graph_outputs=True)
            graph.remove([node, add, cast], safe=True)
            return True
        fused = ops.CAST_ADD.node([x], [ops.OFFSET(value), ops.TO(int(to))], name=node.name)
        replace(graph, [cast, add, node], fused, output)
        return True

    @staticmethod
    def _twin(
        graph: ir.Graph, node: ir.Node, x: ir.Value, offset: float, to: ir.DataType
    ) -> ir.Node | None:
        """A ``CastAdd`` of ``x`` with the same ``offset`` and ``to`` before ``node``."""
        for other in graph:
            if other is node:
                return None
            if (
                ops.CAST_ADD.matches(other)
                and other.inputs[0] is x
                and other.attributes[ops.OFFSET.name].as_float() == offset
                and other.attributes[ops.TO.name].as_int() == int(to)
            ):
                return other
        return None
