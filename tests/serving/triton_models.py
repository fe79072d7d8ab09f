"""ONNX models equivalent to the models of Triton's example repository that tritonclient's
example scripts call, and a repository holding them.

- ``simple``: INPUT0, INPUT1 (INT32 ``[batch, 16]``) -> OUTPUT0 = sum, OUTPUT1 = difference;
  batched (``max_batch_size`` 8, as Triton's config).
- ``simple_string``: the same over BYTES tensors holding decimal integers (ONNX ``Cast``
  from and to strings, which parses and prints integers).
- ``simple_identity``: BYTES INPUT0 -> OUTPUT0.
- ``simple_sequence``: INT32 INPUT ``[1, 1]`` in a sequence; OUTPUT is INPUT plus 1 at
  the sequence's first request (what tritonclient's sequence examples check of Triton's
  model), SUM the running sum of the sequence's inputs: two variables (STATEFUL), reset
  by ``sequence_start``.
- ``simple_int8``, ``simple_fp32``, ``simple_int64``: ``simple`` over other types (the
  model-control example expects seven models in the repository).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh

from tests.helpers import make_model, tensor_info
from tests.serving.conftest import write_config, write_model


def simple_model(dtype: type = np.int32) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 over ``[batch, 16]``."""
    shape = ["batch", 16]
    return make_model(
        [
            oh.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="sum"),
            oh.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="difference"),
        ],
        [tensor_info("INPUT0", dtype, shape), tensor_info("INPUT1", dtype, shape)],
        [tensor_info("OUTPUT0", dtype, shape), tensor_info("OUTPUT1", dtype, shape)],
        name="simple",
    )


def _string_info(name: str) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, onnx.TensorProto.STRING, ["batch", 16])


def simple_string_model() -> onnx.ModelProto:
    """``simple`` over strings: each element parsed as an integer, the results printed."""
    int32, string = onnx.TensorProto.INT32, onnx.TensorProto.STRING
    nodes = [
        oh.make_node("Cast", ["INPUT0"], ["a"], to=int32, name="parse0"),
        oh.make_node("Cast", ["INPUT1"], ["b"], to=int32, name="parse1"),
        oh.make_node("Add", ["a", "b"], ["sum"], name="sum"),
        oh.make_node("Sub", ["a", "b"], ["difference"], name="difference"),
        oh.make_node("Cast", ["sum"], ["OUTPUT0"], to=string, name="print0"),
        oh.make_node("Cast", ["difference"], ["OUTPUT1"], to=string, name="print1"),
    ]
    return make_model(
        nodes,
        [_string_info("INPUT0"), _string_info("INPUT1")],
        [_string_info("OUTPUT0"), _string_info("OUTPUT1")],
        name="simple_string",
    )


def simple_identity_model() -> onnx.ModelProto:
    """BYTES OUTPUT0 = INPUT0."""
    return make_model(
        [oh.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        [_string_info("INPUT0")],
        [_string_info("OUTPUT0")],
        name="simple_identity",
    )


SEQUENCE_STATE = {"started": "started_out", "total": "total_out"}
"""The variables of ``simple_sequence`` (its config's ``stateful`` pairs)."""


def simple_sequence_model() -> onnx.ModelProto:
    """OUTPUT = INPUT + (1 - started), SUM = total + INPUT; ``started`` becomes 1 and
    ``total`` SUM (both start at zero in a new sequence)."""
    one = np.ones((1, 1), np.int32)
    nodes = [
        oh.make_node("Sub", ["one", "started"], ["first"], name="first"),
        oh.make_node("Add", ["INPUT", "first"], ["OUTPUT"], name="output"),
        oh.make_node("Identity", ["one"], ["started_out"], name="started_out"),
        oh.make_node("Add", ["total", "INPUT"], ["total_out"], name="accumulate"),
        oh.make_node("Identity", ["total_out"], ["SUM"], name="sum"),
    ]
    shape = [1, 1]
    return make_model(
        nodes,
        [
            tensor_info("INPUT", np.int32, shape),
            tensor_info("started", np.int32, shape),
            tensor_info("total", np.int32, shape),
        ],
        [
            tensor_info("OUTPUT", np.int32, shape),
            tensor_info("SUM", np.int32, shape),
            tensor_info("started_out", np.int32, shape),
            tensor_info("total_out", np.int32, shape),
        ],
        {"one": one},
        name="simple_sequence",
    )


SIMPLE_BATCHING = {"max_batch_size": 8, "timeout_ms": 1}


def write_triton_repository(repo: Path) -> Path:
    """The seven models above under ``repo`` (with their ``config.json``)."""
    write_model(repo, "simple", 1, simple_model())
    write_config(repo, "simple", {"batching": SIMPLE_BATCHING})
    write_model(repo, "simple_string", 1, simple_string_model())
    write_config(repo, "simple_string", {"batching": False})  # the unbatched model's case
    write_model(repo, "simple_identity", 1, simple_identity_model())
    write_model(repo, "simple_sequence", 1, simple_sequence_model())
    write_config(
        repo, "simple_sequence", {"stateful": SEQUENCE_STATE, "sequence_idle_timeout_s": 60}
    )
    for name, dtype in (("simple_int8", np.int8), ("simple_fp32", np.float32)):
        write_model(repo, name, 1, simple_model(dtype))
    write_model(repo, "simple_int64", 1, simple_model(np.int64))
    return repo
