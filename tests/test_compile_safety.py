"""Compiling is safe on hostile or broken models.

- Constant folding never computes a result it can tell, before computing, exceeds the
  folding cap (a 5e8-element ``ConstantOfShape`` used to take 2 GB during compile).
- A model importing an ``ai.onnx`` opset newer than the device supports is refused.
- A corrupt or cyclic model raises ``InvalidModelError``, whatever form it comes in
  (bytes, path, ``onnx.ModelProto``, ``onnx_ir.Model``), never a parser's own error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

import aioinfer as ai
from aioinfer.devices.cpu.compiler import evaluate_node
from aioinfer.opsets import MAX_ONNX_OPSET
from aioinfer.transforms.constant_folding import MAX_FOLDED_ELEMENTS, ConstantFoldingPass
from tests.helpers import make_model, tensor_info

# -- the folding cap is checked before computing ----------------------------------------

_MEMORY_PROBE = """
import json, resource, sys
import numpy as np, onnx, onnx.helper as oh, onnx.numpy_helper as onh
import aioinfer as ai

elements = int(sys.argv[1])
graph = oh.make_graph(
    [
        oh.make_node("ConstantOfShape", ["shape"], ["big"],
                     value=onh.from_array(np.array([1.0], np.float32))),
        oh.make_node("Shape", ["big"], ["size"]),
        oh.make_node("Add", ["x", "size"], ["y"]),
    ],
    "big_constant",
    [oh.make_tensor_value_info("x", onnx.TensorProto.INT64, [1])],
    [oh.make_tensor_value_info("y", onnx.TensorProto.INT64, [1])],
    initializer=[onh.from_array(np.array([elements], np.int64), "shape")],
)
model = ai.Core().read_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]))
core = ai.Core()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
compiled = core.compile_model(model, "CPU")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
y = compiled.create_infer_request().infer_sync({"x": np.array([7], np.int64)})["y"]
print(json.dumps({"grown_kib": after - before, "y": y.tolist()}))
"""


def _compile_in_a_subprocess(elements: int) -> dict[str, Any]:
    """Compile the ``ConstantOfShape(elements) -> Shape -> Add`` model in a fresh
    interpreter; how much its peak resident memory grew while compiling, and the
    result for x = 7."""
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, str(elements)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_huge_constant_of_shape_does_not_take_memory_while_compiling() -> None:
    """5e8 float32 elements (2 GB) feed a Shape: the compiled model answers from the
    static shape, and compiling grows the peak memory no more than a tiny control model
    does, give or take 200 MB."""
    elements = 500_000_000
    control = _compile_in_a_subprocess(10)
    huge = _compile_in_a_subprocess(elements)
    assert control["y"] == [7 + 10]
    assert huge["y"] == [7 + elements]
    grown_mib = (huge["grown_kib"] - control["grown_kib"]) / 1024
    assert grown_mib < 200, f"compiling took {grown_mib:.0f} MiB more than the control"


ROWS_BIG = 2560
"""Rows of the large outputs below: 2560 x 2048 = 5.2M elements, over the folding cap."""
ROWS_SMALL = 4
"""Rows of the same models made small enough to fold."""
COLUMNS = 2048


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _f32(shape: Sequence[int]) -> np.ndarray:
    size = int(np.prod(shape))
    return (np.arange(size, dtype=np.float32) % 7 - 3).reshape(shape)


Case = tuple[list[onnx.NodeProto], dict[str, np.ndarray]]
"""Nodes computing ``big`` from constants, and those constants."""


def _constant_of_shape(rows: int) -> Case:
    one = onh.from_array(np.array([1.5], np.float32))
    return [oh.make_node("ConstantOfShape", ["shape"], ["big"], value=one)], {
        "shape": _i64(rows, COLUMNS)
    }


def _expand(rows: int) -> Case:
    return [oh.make_node("Expand", ["row", "shape"], ["big"])], {
        "row": _f32([1, COLUMNS]),
        "shape": _i64(rows, COLUMNS),
    }


def _tile(rows: int) -> Case:
    return [oh.make_node("Tile", ["block", "repeats"], ["big"])], {
        "block": _f32([2, COLUMNS]),
        "repeats": _i64(rows // 2, 1),
    }


def _range(rows: int) -> Case:
    return [oh.make_node("Range", ["start", "limit", "delta"], ["big"])], {
        "start": np.array(0.0, np.float32),
        "limit": np.array(rows * COLUMNS / 64, np.float32),
        "delta": np.array(1 / 64, np.float32),
    }


def _one_hot(rows: int) -> Case:
    return [oh.make_node("OneHot", ["indices", "depth", "values"], ["big"])], {
        "indices": np.arange(rows * 2, dtype=np.int64) % 1000,
        "depth": np.array(COLUMNS // 2, np.int64),  # the reference wants a scalar
        "values": np.array([0.0, 2.0], np.float32),
    }


def _broadcast_add(rows: int) -> Case:
    return [oh.make_node("Add", ["column", "row"], ["big"])], {
        "column": _f32([rows, 1]),
        "row": _f32([1, COLUMNS]),
    }


def _matmul(rows: int) -> Case:
    return [oh.make_node("MatMul", ["column", "row"], ["big"])], {
        "column": _f32([rows, 1]),
        "row": _f32([1, COLUMNS]),
    }


def _gather(rows: int) -> Case:
    return [oh.make_node("Gather", ["table", "indices"], ["big"], axis=0)], {
        "table": _f32([4, COLUMNS]),
        "indices": np.arange(rows, dtype=np.int64) % 4,
    }


def _pad(rows: int) -> Case:
    return [oh.make_node("Pad", ["row", "pads"], ["big"], mode="constant")], {
        "row": _f32([1, COLUMNS]),
        "pads": _i64(0, 0, rows - 1, 0),
    }


def _resize(rows: int) -> Case:
    scales = np.array([1, 1, rows / 2, 1], np.float32)
    return [oh.make_node("Resize", ["image", "", "scales"], ["big"], mode="nearest")], {
        "image": _f32([1, 1, 2, COLUMNS]),
        "scales": scales,
    }


GROWING = [
    pytest.param(_constant_of_shape, id="ConstantOfShape"),
    pytest.param(_expand, id="Expand"),
    pytest.param(_tile, id="Tile"),
    pytest.param(_range, id="Range"),
    pytest.param(_one_hot, id="OneHot"),
    pytest.param(_broadcast_add, id="Add-broadcast"),
    pytest.param(_matmul, id="MatMul"),
    pytest.param(_gather, id="Gather"),
    pytest.param(_pad, id="Pad"),
    pytest.param(_resize, id="Resize"),
]


def _growing_model(case: Callable[[int], Case], rows: int) -> onnx.ModelProto:
    """``y = ReduceSum(big) + x``: ``big`` comes from constants only."""
    nodes, constants = case(rows)
    nodes = [
        *nodes,
        oh.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
        oh.make_node("Add", ["x", "total"], ["y"]),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [])],
        [tensor_info("y", np.float32, [])],
        constants,
    )


def _fold(proto: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """Run constant folding with the CPU kernels: (the op types it computed, the op types
    left in the graph)."""
    computed: list[str] = []

    def evaluate(
        node: ir.Node, opset: int, inputs: Sequence[np.ndarray | None]
    ) -> Sequence[np.ndarray]:
        computed.append(node.op_type)
        return evaluate_node(node, opset, inputs)

    model = ir.serde.deserialize_model(proto)
    ConstantFoldingPass(evaluate)(model)
    return computed, [node.op_type for node in model.graph]


@pytest.mark.parametrize("case", GROWING)
def test_an_output_over_the_cap_is_never_computed(case: Callable[[int], Case]) -> None:
    proto = _growing_model(case, ROWS_BIG)
    (op,) = [n.op_type for n in proto.graph.node[:1]]
    computed, left = _fold(proto)
    assert op not in computed  # not even to find out that it is too large
    assert left == [op, "ReduceSum", "Add"]


@pytest.mark.parametrize("case", GROWING)
def test_the_same_operator_under_the_cap_is_folded(case: Callable[[int], Case]) -> None:
    """The control: the size rule does not stop folding of small outputs."""
    proto = _growing_model(case, ROWS_SMALL)
    (op,) = [n.op_type for n in proto.graph.node[:1]]
    computed, left = _fold(proto)
    assert computed == [op, "ReduceSum"]
    assert left == ["Add"]


@pytest.mark.parametrize("case", GROWING)
def test_models_with_large_constants_compute_right(
    core: ai.Core, case: Callable[[int], Case]
) -> None:
    proto = _growing_model(case, ROWS_BIG)
    x = np.array(0.25, np.float32)
    (want,) = ReferenceEvaluator(proto).run(None, {"x": x})
    got = core.compile_model(proto, "CPU").create_infer_request().infer_sync({"x": x})["y"]
    # float32 sums of 5M terms, by two implementations: relative tolerance 1e-4.
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_a_declared_output_shape_over_the_cap_is_not_computed() -> None:
    """An operator without a size rule: its output shape, stated in the graph, decides."""
    rows = MAX_FOLDED_ELEMENTS // COLUMNS + 1
    proto = make_model(
        [
            oh.make_node("Col2Im", ["columns", "image_shape", "block"], ["big"]),
            oh.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
            oh.make_node("Add", ["x", "total"], ["y"]),
        ],
        [tensor_info("x", np.float32, [])],
        [tensor_info("y", np.float32, [])],
        {
            "columns": _f32([1, 1, rows * COLUMNS]),
            "image_shape": _i64(rows, COLUMNS),
            "block": _i64(1, 1),
        },
    )
    proto.graph.value_info.append(tensor_info("big", np.float32, [1, 1, rows, COLUMNS]))
    computed, left = _fold(proto)
    assert "Col2Im" not in computed and "Col2Im" in left


# -- opsets the device does not support -------------------------------------------------


def _relu(opset: int, domain: str = "") -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "relu",
        [tensor_info("x", np.float32, [3])],
        [tensor_info("y", np.float32, [3])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid(domain, opset)])


@pytest.mark.parametrize("domain", ["", "ai.onnx"])
@pytest.mark.parametrize("form", ["proto", "bytes", "onnx_ir"])
def test_a_newer_opset_than_the_device_supports_is_refused(
    core: ai.Core, domain: str, form: str
) -> None:
    newer = MAX_ONNX_OPSET + 1
    proto = _relu(newer, domain)
    source: Any = {
        "proto": proto,
        "bytes": proto.SerializeToString(),
        "onnx_ir": ir.serde.deserialize_model(proto),
    }[form]
    with pytest.raises(ai.UnsupportedOpsetError) as info:
        core.compile_model(source, "CPU")
    assert f"opset {newer}" in str(info.value)
    assert f"up to {MAX_ONNX_OPSET}" in str(info.value)
    assert isinstance(info.value, ai.CompileError)


def test_a_newer_opset_is_refused_before_the_cache(core: ai.Core, tmp_path: Path) -> None:
    proto = _relu(MAX_ONNX_OPSET + 5)
    with pytest.raises(ai.UnsupportedOpsetError, match=f"opset {MAX_ONNX_OPSET + 5}"):
        core.compile_model(proto, "CPU", {"CACHE_DIR": str(tmp_path)})
    assert list(tmp_path.iterdir()) == []


def test_the_newest_supported_opset_compiles(core: ai.Core) -> None:
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    compiled = core.compile_model(_relu(MAX_ONNX_OPSET), "CPU")
    np.testing.assert_array_equal(compiled.create_infer_request().infer_sync([x])[0], [0, 0, 2])


# -- corrupt and cyclic models, in every form --------------------------------------------


def _good() -> onnx.ModelProto:
    return make_model(
        [oh.make_node("Relu", ["x"], ["h"], name="first"), oh.make_node("Neg", ["h"], ["y"])],
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
    )


def _unchecked(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = oh.make_graph(
        nodes, "broken", [tensor_info("x", np.float32, [2])], [tensor_info("y", np.float32, [2])]
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _cycle() -> onnx.ModelProto:
    """A consumes B's output and B consumes A's."""
    return _unchecked(
        [
            oh.make_node("Add", ["x", "b"], ["a"], name="A"),
            oh.make_node("Relu", ["a"], ["b"], name="B"),
            oh.make_node("Neg", ["b"], ["y"], name="C"),
        ]
    )


def _missing_input() -> onnx.ModelProto:
    return _unchecked(
        [oh.make_node("Relu", ["x"], ["h"]), oh.make_node("Add", ["h", "nowhere"], ["y"])]
    )


def _duplicate_outputs() -> onnx.ModelProto:
    return _unchecked(
        [
            oh.make_node("Relu", ["x"], ["y"], name="A"),
            oh.make_node("Neg", ["x"], ["y"], name="B"),
        ]
    )


def _invalid_utf8() -> bytes:
    """The good model with the name of its first node made invalid UTF-8 (the protobuf
    runtime accepts the bytes; a string field must be UTF-8)."""
    data = _good().SerializeToString()
    assert data.count(b"first") == 1
    return data.replace(b"first", b"fi\xffst")


def _ir_value(name: str) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))


def _ir_duplicate_outputs() -> ir.Model:
    """onnx-ir's reader refuses the proto, but the IR can be built directly."""
    x = _ir_value("x")
    first = ir.Node("", "Relu", [x], outputs=[_ir_value("y")], name="A")
    second = ir.Node("", "Neg", [x], outputs=[_ir_value("y")], name="B")
    graph = ir.Graph([x], [first.outputs[0]], nodes=[first, second], opset_imports={"": 18})
    return ir.Model(graph, ir_version=8)


def _ir_invalid_utf8() -> ir.Model:
    """A Python string holding a lone surrogate: what invalid UTF-8 decodes to."""
    x = _ir_value("x")
    node = ir.Node("", "Relu", [x], outputs=[_ir_value("y\udcff")], name="A")
    graph = ir.Graph([x], [node.outputs[0]], nodes=[node], opset_imports={"": 18})
    return ir.Model(graph, ir_version=8)


GARBAGE = np.random.default_rng(3).bytes(400)
TRUNCATED = _good().SerializeToString()[:-7]

BYTES_CASES: list[Any] = [
    pytest.param(GARBAGE, "not an ONNX model", id="garbage"),
    pytest.param(TRUNCATED, "truncated", id="truncated"),
    pytest.param(_invalid_utf8(), "not valid UTF-8", id="invalid-utf8"),
    pytest.param(_cycle().SerializeToString(), "topologically sorted", id="cycle"),
    pytest.param(_missing_input().SerializeToString(), "nowhere", id="missing-input"),
    pytest.param(_duplicate_outputs().SerializeToString(), "'y'", id="duplicate-outputs"),
]

IR_CASES: list[Any] = [
    pytest.param(lambda: ir.serde.deserialize_model(_cycle()), "cycle", id="cycle"),
    pytest.param(lambda: ir.serde.deserialize_model(_missing_input()), "nowhere", id="missing"),
    pytest.param(_ir_duplicate_outputs, "'y' is defined twice", id="duplicate-outputs"),
    pytest.param(_ir_invalid_utf8, "not valid UTF-8", id="invalid-utf8"),
]

READERS = [
    pytest.param(lambda core, source: core.read_model(source), id="read_model"),
    pytest.param(lambda core, source: core.compile_model(source, "CPU"), id="compile_model"),
]


def _parsed(data: bytes) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    return proto


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize(("data", "words"), BYTES_CASES)
def test_corrupt_models_raise_invalid_model_as_bytes_and_paths(
    core: ai.Core, tmp_path: Path, read: Callable[[ai.Core, Any], object], data: bytes, words: str
) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    for source in (data, path, str(path)):
        with pytest.raises(ai.InvalidModelError, match=words):
            read(core, source)


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize(
    ("data", "words"), [p for p in BYTES_CASES if p.id not in ("garbage", "truncated")]
)
def test_corrupt_models_raise_invalid_model_as_protos(
    core: ai.Core, read: Callable[[ai.Core, Any], object], data: bytes, words: str
) -> None:
    with pytest.raises(ai.InvalidModelError, match=words):
        read(core, _parsed(data))


@pytest.mark.parametrize("read", READERS)
@pytest.mark.parametrize(("make", "words"), IR_CASES)
def test_corrupt_models_raise_invalid_model_as_onnx_ir(
    core: ai.Core, read: Callable[[ai.Core, Any], object], make: Callable[[], ir.Model], words: str
) -> None:
    with pytest.raises(ai.InvalidModelError, match=words):
        read(core, make())


def test_a_good_onnx_ir_model_still_reads_and_runs(core: ai.Core) -> None:
    model = ir.serde.deserialize_model(_good())
    x = np.array([-1.0, 2.0], np.float32)
    y = core.compile_model(model, "CPU").create_infer_request().infer_sync([x])[0]
    np.testing.assert_array_equal(y, [0.0, -2.0])
