"""Fuse paddle2onnx's tensor-array write, ``arr[:, i:min(e, len)] = value``, into one node.

paddle2onnx writes an element of a tensor array (a decoder's per-step outputs) as sixteen
nodes (axis ``a``, ``arr`` of rank ``r``)::

    m = Min(Gather(Shape(arr), [a]), e)
    S = Shape(Slice(arr, i, m, axes=[a], steps=[1]))
    updates = Expand(Unsqueeze(value, [a]), S)
    indices = Tile(Reshape(Range(Squeeze(i), Squeeze(m), 1), [1, .., -1, .., 1]),
                   Concat(S[0:a], [1], S[a+1:r]))
    out = ScatterElements(arr, indices, updates, axis=a)

which becomes ``ai.aioinfer::SliceAssign(arr, value, i, e, axis=a)``: a copy of ``arr``
with ``value`` written into the slice (the kernel's docstring gives the edge cases). Inside
SLANet's 501-step decoder Loop two of them took ~80 of the ~215 us of an iteration.

Every piece is checked (axis, step 1, the reshape and tile shapes, the int64 bounds, one
dtype for ``arr`` and ``value``, no other reader of an intermediate), so a near miss stays
as it is.
"""

from __future__ import annotations

from typing import TypeGuard

import onnx_ir as ir

from aioinfer.devices.cpu import ops
from aioinfer.transforms.rewrite import (
    RewritePass,
    fed_by,
    input_at,
    ints,
    is_op,
    only_read_by,
    producer,
    replace,
)

"""The fused operator: ``SliceAssign(data, value, start, end)`` with an ``axis``."""


def _is_int64_bound(value: ir.Value | None) -> TypeGuard[ir.Value]:
    """An int64 value of one element at most of rank 1 (what Slice and Min take)."""
    if value is None or value.dtype != ir.DataType.INT64 or value.shape is None:
        return False
    return len(value.shape) <= 1 and all(d == 1 for d in value.shape.dims)


def _axis(value: ir.Value | None, rank: int) -> int | None:
    """The one axis a constant names, normalised for ``rank``, else None."""
    axes = ints(value)
    if axes is None or len(axes) != 1 or not -rank <= axes[0] < rank:
        return None
    return axes[0] % rank


def _squeezed(value: ir.Value | None, source: ir.Value, reader: ir.Node) -> ir.Node | None:
    """The Squeeze of a one-element ``source`` (no axes, or axis 0) giving ``value``, which
    ``reader`` alone reads."""
    node = fed_by(value, reader, "Squeeze")
    if node is None or node.inputs[0] is not source:
        return None
    axes = input_at(node, 1)
    attr = node.attributes.get("axes")
    listed = ints(axes) if axes is not None else (None if attr is None else attr.as_ints())
    if (axes is not None and listed is None) or (listed is not None and list(listed) != [0]):
        return None
    return node


class FuseSliceAssignPass(RewritePass):
    """paddle2onnx's tensor-array write, rooted at its ScatterElements, becomes one
    ``SliceAssign`` node."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        if not is_op(node, "ScatterElements") or len(node.inputs) != 3:
            return False
        reduction = node.attributes.get("reduction")
        if reduction is not None and reduction.as_string() != "none":
            return False
        arr, indices, updates = node.inputs
        if arr is None or arr.shape is None or arr.dtype is None:
            return False
        rank = len(arr.shape)
        axis = node.attributes.get_int("axis", 0)
        if not -rank <= axis < rank:
            return False
        axis %= rank
        matched = self._match(node, arr, indices, updates, axis, rank)
        if matched is None:
            return False
        nodes, value, start, end = matched
        fused = ops.SLICE_ASSIGN.node(
            [arr, value, start, end], [ops.SLICE_AXIS(axis)], name=node.name
        )
        replace(graph, [*nodes, node], fused, node.outputs[0])
        return True

    @staticmethod
    def _match(
        scatter: ir.Node,
        arr: ir.Value,
        indices: ir.Value | None,
        updates: ir.Value | None,
        axis: int,
        rank: int,
    ) -> tuple[list[ir.Node], ir.Value, ir.Value, ir.Value] | None:
        """The nodes of the pattern (without the ``scatter`` ScatterElements), the written
        value, the start and the end before its Min; None when anything differs."""
        # updates = Expand(Unsqueeze(value, [axis]), Shape(Slice(arr, i, m, [axis], [1])))
        expand = fed_by(updates, scatter, "Expand")
        if expand is None:
            return None
        unsqueezed, slice_shape = expand.inputs
        unsqueeze = fed_by(unsqueezed, expand, "Unsqueeze")
        if unsqueeze is None:
            return None
        value = unsqueeze.inputs[0]
        if value is None or value.dtype != arr.dtype:
            return None
        axes_attr = unsqueeze.attributes.get("axes")
        if len(unsqueeze.inputs) > 1:
            if _axis(unsqueeze.inputs[1], rank) != axis:
                return None
        elif axes_attr is None or [a % rank for a in axes_attr.as_ints()] != [axis]:
            return None
        shape_of_slice = producer(slice_shape, "Shape")
        if shape_of_slice is None or shape_of_slice.attributes:
            return None
        sliced = shape_of_slice.inputs[0]
        slicer = fed_by(sliced, shape_of_slice, "Slice")
        if slicer is None or len(slicer.inputs) != 5:
            return None
        source, start, bound, slice_axes, slice_steps = slicer.inputs
        if source is not arr or _axis(slice_axes, rank) != axis or ints(slice_steps) != [1]:
            return None
        if not _is_int64_bound(start) or start.shape != ir.Shape([1]):
            return None  # Slice's starts are 1-D
        # m = Min(Gather(Shape(arr), [axis]), e)
        minimum = producer(bound, "Min")
        if minimum is None or len(minimum.inputs) != 2:
            return None
        assert bound is not None  # a Min made it
        gathers = [
            (gather, end)
            for gathered, end in (minimum.inputs, minimum.inputs[::-1])
            if (gather := fed_by(gathered, minimum, "Gather")) is not None
        ]
        if not gathers:
            return None
        gather, end = gathers[0]
        if not _is_int64_bound(end) or gather.attributes.get_int("axis", 0) != 0:
            return None
        length_of = fed_by(gather.inputs[0], gather, "Shape")
        if length_of is None or length_of.attributes or length_of.inputs[0] is not arr:
            return None
        if gather.inputs[1] is None or gather.inputs[1].shape != ir.Shape([1]):
            return None
        if _axis(gather.inputs[1], rank) != axis:
            return None
        # indices = Tile(Reshape(Range(Squeeze(i), Squeeze(m), 1), ...), Concat(...))
        tile = fed_by(indices, scatter, "Tile")
        if tile is None:
            return None
        reshaped, repeats = tile.inputs
        reshape = fed_by(reshaped, tile, "Reshape")
        if reshape is None:
            return None
        if ints(reshape.inputs[1]) != [1] * axis + [-1] + [1] * (rank - axis - 1):
            return None
        ranged = reshape.inputs[0]
        range_node = fed_by(ranged, reshape, "Range")
        if range_node is None:
            return None
        first, last, delta = range_node.inputs
        squeeze_start = _squeezed(first, start, range_node)
        squeeze_bound = _squeezed(last, bound, range_node)
        if squeeze_start is None or squeeze_bound is None or ints(delta) != [1]:
            return None
        concat = fed_by(repeats, tile, "Concat")
        if concat is None:
            return None
        pieces = FuseSliceAssignPass._repeats(concat, slice_shape, axis, rank)
        if pieces is None:
            return None
        nodes = [
            length_of,
            gather,
            minimum,
            slicer,
            shape_of_slice,
            unsqueeze,
            expand,
            squeeze_start,
            squeeze_bound,
            range_node,
            reshape,
            *pieces,
            concat,
            tile,
        ]
        if not only_read_by(bound, [slicer, squeeze_bound]):
            return None
        assert slice_shape is not None
        if not only_read_by(slice_shape, [expand, *pieces]):
            return None
        return nodes, value, start, end

    @staticmethod
    def _repeats(
        concat: ir.Node, slice_shape: ir.Value | None, axis: int, rank: int
    ) -> list[ir.Node] | None:
        """The Slices of ``slice_shape`` that ``concat`` joins with a ``[1]`` at ``axis``
        into ``S[0:axis] + [1] + S[axis+1:rank]``, else None."""
        if concat.attributes.get_int("axis", 1) not in (0, -1):
            return None
        position = 0
        pieces: list[ir.Node] = []
        for piece in concat.inputs:
            if position == axis:
                if ints(piece) != [1]:
                    return None
                position += 1
                continue
            node = fed_by(piece, concat, "Slice")
            if node is None or node.inputs[0] is not slice_shape:
                return None
            starts = ints(node.inputs[1])
            ends = ints(node.inputs[2])
            axes = ints(node.inputs[3]) if input_at(node, 3) is not None else [0]
            steps = ints(node.inputs[4]) if input_at(node, 4) is not None else [1]
            if starts != [position] or ends is None or len(ends) != 1 or axes != [0]:
                return None
            if steps != [1] or not position < ends[0] <= (axis if position < axis else rank):
                return None
            pieces.append(node)
            position = ends[0]
        return pieces if position == rank else None
