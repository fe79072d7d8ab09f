"""Kernels of the fused nodes that a decoder Loop's body runs every iteration.

A decoding Loop (SLANet's: 501 iterations) pays the plan's per-step cost of ~1-3 us for
every node of its body on every iteration; the fusion passes turn its bookkeeping chains
into one node each:

- ``SliceAssign(data, value, start, end)`` with ``axis`` (see
  :mod:`aioinfer.devices.cpu.passes.fuse_slice_assign`): a copy of ``data`` with
  ``value`` (unsqueezed at ``axis``, broadcast) written into ``data[.., start:min(end,
  len), ..]`` along ``axis`` — paddle2onnx's tensor-array write, sixteen nodes.
- ``GRUGates(gx, gh, h)`` with ``hidden_size`` (see
  :mod:`aioinfer.devices.cpu.passes.fuse_gru_cell`): the gates of a GRU cell from its two
  projections (reset, update, candidate thirds of the last axis): ``(h - c) * z + c``
  with ``c = tanh(gx2 + r * gh2)``, twelve nodes.
- ``CastAdd(x)`` with ``offset`` and ``to`` (see
  :mod:`aioinfer.devices.cpu.passes.fuse_counters`): ``cast(float32(x) + offset, to)``, a
  counter's ``i + 1`` as paddle2onnx writes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from aioinfer.devices.cpu import ops
from aioinfer.devices.cpu.kernels.activations import sigmoid
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


def _bound(value: np.ndarray, name: str) -> int:
    if value.size != 1:
        raise ValueError(f"SliceAssign: {name} must have one element, got shape {value.shape}")
    return int(value.reshape(-1)[0])


@kernel(ops.SLICE_ASSIGN.name, domain=ops.DOMAIN, execution_type="fused")
def _slice_assign(spec: NodeSpec) -> Kernel:
    """What the ScatterElements of the unfused pattern computes: it writes at the indices
    ``Range(start, m)`` (``m = min(end, len)``) updates shaped like ``Slice(data, start,
    m)``; where those two counts differ (a negative start whose range does not match its
    slice) ScatterElements fails, and so does this kernel. A start at or past the end
    writes nothing."""
    axis = int(ops.SLICE_AXIS.read(spec))

    def run(data: np.ndarray, value: np.ndarray, start: np.ndarray, end: np.ndarray) -> Any:
        length = data.shape[axis]
        first = _bound(start, "start")
        stop = min(length, _bound(end, "end"))
        count = max(0, stop - first)
        sliced = len(range(*slice(first, stop).indices(length)))
        if count != sliced:
            raise ValueError(
                f"SliceAssign: the indices {first}..{stop - 1} ({count}) do not match the "
                f"slice {first}:{stop} of an axis of {length} ({sliced} elements)"
            )
        out = data.copy()
        begin = first + length if first < 0 else first
        key = (slice(None),) * axis + (slice(begin, begin + count),)
        out[key] = np.expand_dims(value, axis)  # broadcast as the pattern's Expand
        return (out,)

    return run


@kernel(ops.GRU_GATES.name, domain=ops.DOMAIN, execution_type="fused")
def _gru_gates(spec: NodeSpec) -> Kernel:
    """The same element-wise operations as the unfused nodes, in the same order (the
    same float results), broadcasting as they do; both sigmoids over one contiguous sum."""
    hidden = int(ops.HIDDEN_SIZE.read(spec))
    gates = 2 * hidden

    def run(gx: np.ndarray, gh: np.ndarray, h: np.ndarray) -> Any:
        if gx.shape[-1] != 3 * hidden or gh.shape[-1] != 3 * hidden:
            raise ValueError(
                f"GRUGates: the projections' last axes should be 3 * {hidden}, got "
                f"{gx.shape} and {gh.shape}"
            )
        total = np.add(gx[..., :gates], gh[..., :gates])
        sigmoids = sigmoid(total, out=total)  # the Sigmoid kernel's, in place
        candidate = np.multiply(sigmoids[..., :hidden], gh[..., gates:])
        candidate = np.add(gx[..., gates:], candidate)
        np.tanh(candidate, out=candidate)
        out = np.subtract(h, candidate)
        update = sigmoids[..., hidden:]
        out = np.multiply(out, update, out=out if out.shape == update.shape else None)
        return (np.add(out, candidate, out=out if out.shape == candidate.shape else None),)

    return run


@kernel(ops.CAST_ADD.name, domain=ops.DOMAIN, execution_type="fused")
def _cast_add(spec: NodeSpec) -> Kernel:
    """The Cast kernels' conversions around the Add kernel's float32 addition."""
    offset = np.float32(ops.OFFSET.read(spec))
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(ops.TO.read(spec))))

    def run(x: np.ndarray) -> Any:
        return (np.add(x.astype(np.float32), offset).astype(dtype),)

    return run
