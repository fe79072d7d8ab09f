"""PrepackWeightsPass: constant B operands of matrix products stored as BLAS reads them.

Numbers are compared with onnx.reference on the model as written (float32, rtol 1e-4,
atol 1e-5: a transposed weight only changes the order BLAS reads it in).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir

import aioinfer as ai
from aioinfer.devices.cpu.passes.fold_transpose import FoldTransposePass
from aioinfer.devices.cpu.passes.fuse_activation import FuseActivationPass
from aioinfer.devices.cpu.passes.prepack_weights import PrepackWeightsPass
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

RNG = np.random.default_rng(7)


def _weight(model: ir.Model, name: str) -> np.ndarray:
    tensor = model.graph.initializers[name].const_value
    assert tensor is not None
    return np.asarray(tensor.numpy())


def _trans_b(model: ir.Model) -> list[int]:
    return [n.attributes["transB"].as_int() for n in model.graph if "transB" in n.attributes]


def _linear_model() -> onnx.ModelProto:
    """Two Linear layers as PyTorch exports them: ``Gemm(x, W, b, transB=1)`` + Relu."""
    nodes = [
        oh.make_node("Gemm", ["x", "w1", "b1"], ["g1"], transB=1),
        oh.make_node("Relu", ["g1"], ["h"]),
        oh.make_node("Gemm", ["h", "w2", "b2"], ["y"], transB=1, alpha=0.5),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, ["batch", 6])],
        [tensor_info("y", np.float32, ["batch", 3])],
        {
            "w1": RNG.standard_normal((5, 6)).astype(np.float32),
            "b1": RNG.standard_normal(5).astype(np.float32),
            "w2": RNG.standard_normal((3, 5)).astype(np.float32),
            "b2": RNG.standard_normal(3).astype(np.float32),
        },
    )


def test_transposed_gemm_weights_are_stored_transposed() -> None:
    model = _linear_model()
    after = applied(model, FuseActivationPass(), PrepackWeightsPass())
    assert op_types(after) == ["FusedGemm", "Gemm"]
    assert _trans_b(after) == [0, 0]
    for name, source in (("w1", model.graph.initializer[0]), ("w2", model.graph.initializer[2])):
        stored = _weight(after, name)
        assert stored.flags.c_contiguous
        np.testing.assert_array_equal(stored, onnx.numpy_helper.to_array(source).T)
        assert after.graph.initializers[name].shape == ir.Shape(stored.shape)
    feeds = {"x": RNG.standard_normal((4, 6)).astype(np.float32)}
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want)
    assert_close(run_compiled(model, feeds), want)


def test_weights_listed_as_graph_inputs_are_prepacked_too() -> None:
    """Older exporters list initializers among the graph inputs; aioinfer treats them as
    weights (no port), so they are stored transposed like any other."""
    model = _linear_model()
    weights = [i for i in model.graph.initializer if i.name.startswith("w")]
    model.graph.input.extend(
        oh.make_tensor_value_info(w.name, onnx.TensorProto.FLOAT, list(w.dims)) for w in weights
    )
    compiled = ai.Core().compile_model(model, "CPU", {})
    assert [p.name for p in compiled.inputs] == ["x"]
    assert _trans_b(compiled.ir_model) == [0, 0]  # type: ignore[attr-defined]
    feeds = {"x": RNG.standard_normal((3, 6)).astype(np.float32)}
    got = compiled.create_infer_request().infer_sync(feeds).to_tuple()
    assert_close(list(got), run_reference(model, feeds))


def test_export_and_import_keep_the_prepacked_layout() -> None:
    """The blob holds the transformed graph: importing runs no pass, so the weights are
    transposed exactly once."""
    model = _linear_model()
    core = ai.Core()
    compiled = core.compile_model(model, "CPU", {})
    assert _trans_b(compiled.ir_model) == [0, 0]  # type: ignore[attr-defined]
    imported = core.import_model(compiled.export_model(), "CPU")
    assert _trans_b(imported.ir_model) == [0, 0]  # type: ignore[attr-defined]
    assert _weight(imported.ir_model, "w1").shape == (6, 5)  # type: ignore[attr-defined]
    feeds = {"x": RNG.standard_normal((2, 6)).astype(np.float32)}
    want = run_reference(model, feeds)
    for target in (compiled, imported):
        got = target.create_infer_request().infer_sync(feeds).to_tuple()
        assert_close(list(got), want)


def test_a_weight_shared_by_transposed_products_is_transposed_once() -> None:
    nodes = [
        oh.make_node("Gemm", ["x", "w"], ["a"], transB=1),
        oh.make_node("Gemm", ["a", "w"], ["y"], transB=1),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 4])],
        [tensor_info("y", np.float32, [2, 4])],
        {"w": RNG.standard_normal((4, 4)).astype(np.float32)},
    )
    after = applied(model, PrepackWeightsPass())
    assert _trans_b(after) == [0, 0]
    assert len(after.graph.initializers) == 1
    np.testing.assert_array_equal(
        _weight(after, "w"), onnx.numpy_helper.to_array(model.graph.initializer[0]).T
    )
    feeds = {"x": RNG.standard_normal((2, 4)).astype(np.float32)}
    assert_close(run_ir(after, feeds), run_reference(model, feeds))


def test_a_weight_also_read_in_its_stored_layout_stays() -> None:
    """A tied embedding (Gather) and a MatMul read W as stored: no transposed copy."""
    nodes = [
        oh.make_node("Gather", ["w", "ids"], ["e"]),
        oh.make_node("Gemm", ["e", "w"], ["logits"], transB=1),
        oh.make_node("MatMul", ["logits", "w"], ["y"]),
    ]
    weight = RNG.standard_normal((5, 3)).astype(np.float32)
    model = make_model(
        nodes,
        [tensor_info("ids", np.int64, [2])],
        [tensor_info("logits", np.float32, [2, 5]), tensor_info("y", np.float32, [2, 3])],
        {"w": weight},
    )
    after = applied(model, PrepackWeightsPass())
    assert _trans_b(after) == [1]
    np.testing.assert_array_equal(_weight(after, "w"), weight)
    feeds = {"ids": np.array([4, 0], np.int64)}
    assert_close(run_ir(after, feeds), run_reference(model, feeds))


def test_a_folded_transpose_becomes_contiguous() -> None:
    """Constant folding leaves ``Transpose(W)`` as a strided view; the pass stores it
    C-contiguous (as an exported model holds it), the value unchanged."""
    weight = RNG.standard_normal((4, 6)).astype(np.float32)
    nodes = [
        oh.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        oh.make_node("MatMul", ["x", "wt"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 3, 6])],
        [tensor_info("y", np.float32, [2, 3, 4])],
        {"w": weight},
    )
    folded = applied(model)
    assert op_types(folded) == ["MatMul"]
    assert not _weight(folded, "wt").flags.c_contiguous
    after = applied(model, PrepackWeightsPass())
    stored = _weight(after, "wt")
    assert stored.flags.c_contiguous
    np.testing.assert_array_equal(stored, weight.T)
    feeds = {"x": RNG.standard_normal((2, 3, 6)).astype(np.float32)}
    want = run_reference(model, feeds)
    assert_close(run_ir(after, feeds), want)
    assert_close(run_compiled(model, feeds), want)


def test_a_folded_transpose_of_a_stacked_weight_clears_fused_matmul_flag() -> None:
    """``MatMul(x, Transpose(W))`` on a 3-D W (a Transpose constant folding did not
    fold, as for a weight above its size limit) becomes FusedMatMul with transB=1, then
    transB=0 on W with its last two axes swapped."""
    weight = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    nodes = [
        oh.make_node("Transpose", ["w"], ["wt"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["x", "wt"], ["y"]),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 3, 6])],
        [tensor_info("y", np.float32, [2, 3, 4])],
        {"w": weight},
    )
    after = ir.serde.deserialize_model(model)
    ir.passes.PassManager([FoldTransposePass()])(after)
    (fused,) = after.graph
    assert (fused.domain, fused.op_type, _trans_b(after)) == (AIOINFER_DOMAIN, "FusedMatMul", [1])
    ir.passes.PassManager([PrepackWeightsPass()])(after)
    assert _trans_b(after) == [0]
    np.testing.assert_array_equal(_weight(after, "w"), weight.transpose(0, 2, 1))
    feeds = {"x": RNG.standard_normal((2, 3, 6)).astype(np.float32)}
    assert_close(run_ir(after, feeds), run_reference(model, feeds))


def test_weights_that_are_graph_outputs_or_not_float_stay() -> None:
    nodes = [
        oh.make_node("Gemm", ["x", "w"], ["y"], transB=1),
        oh.make_node("Gemm", ["n", "k"], ["z"], transB=1),
    ]
    model = make_model(
        nodes,
        [tensor_info("x", np.float32, [2, 3]), tensor_info("n", np.int64, [2, 3])],
        [
            tensor_info("y", np.float32, [2, 4]),
            tensor_info("w", np.float32, [4, 3]),
            tensor_info("z", np.int64, [2, 4]),
        ],
        {
            "w": RNG.standard_normal((4, 3)).astype(np.float32),
            "k": RNG.integers(-3, 3, (4, 3)).astype(np.int64),
        },
    )
    after = ir.serde.deserialize_model(model)
    result = PrepackWeightsPass()(after)
    assert not result.modified
    assert _trans_b(after) == [1, 1]


def test_a_gemm_reading_a_transposed_weight_in_a_stateful_model() -> None:
    """A recurrent cell ``h = tanh(Gemm([x, h], W, b, transB=1))`` made stateful: the
    steps equal the reference fed its own state back."""
    hidden, features = 3, 4
    nodes = [
        oh.make_node("Concat", ["x", "past_h"], ["xh"], axis=1),
        oh.make_node("Gemm", ["xh", "w", "b"], ["pre"], transB=1),
        oh.make_node("Tanh", ["pre"], ["present_h"]),
        oh.make_node("Gemm", ["present_h", "v"], ["y"], transB=1),
    ]
    model = make_model(
        nodes,
        [
            tensor_info("x", np.float32, [1, features]),
            tensor_info("past_h", np.float32, [1, hidden]),
        ],
        [
            tensor_info("y", np.float32, [1, 2]),
            tensor_info("present_h", np.float32, [1, hidden]),
        ],
        {
            "w": RNG.standard_normal((hidden, features + hidden)).astype(np.float32),
            "b": RNG.standard_normal(hidden).astype(np.float32),
            "v": RNG.standard_normal((2, hidden)).astype(np.float32),
        },
    )
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    assert _trans_b(compiled.ir_model) == [0, 0]  # type: ignore[attr-defined]
    request = compiled.create_infer_request()
    state = np.zeros((1, hidden), np.float32)
    for _ in range(3):
        x = RNG.standard_normal((1, features)).astype(np.float32)
        y, state = run_reference(model, {"x": x, "past_h": state})
        got = request.infer_sync({"x": x})
        assert_close([got["y"]], [y])
    assert_close([request.query_state()[0].state], [state])
