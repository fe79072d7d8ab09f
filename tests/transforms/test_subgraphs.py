"""SubgraphsPass: the graph passes also run inside If and Loop bodies."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnx_ir as ir

import aioinfer as ai
from aioinfer.devices.cpu.compiler import evaluate_node
from aioinfer.devices.cpu.passes.fuse_activation import FuseActivationPass
from aioinfer.transforms.constant_folding import ConstantFoldingPass
from aioinfer.transforms.fold_batchnorm import FoldBatchNormPass
from aioinfer.transforms.subgraphs import SubgraphsPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import assert_close, run_compiled, run_reference

RNG = np.random.default_rng(3)


def _constant(name: str, array: np.ndarray) -> onnx.NodeProto:
    return oh.make_node("Constant", [], [name], value=onh.from_array(array, name))


def _branch(tag: str, scale: float) -> onnx.GraphProto:
    """A body as exporters write it: weights as Constant nodes, the Conv weight sliced
    out of a larger buffer at run time, then Conv + BatchNormalization + Relu."""
    channels = 4
    nodes = [
        _constant(f"{tag}_buffer", RNG.standard_normal((2 * channels, 3, 3)).astype(np.float32)),
        _constant(f"{tag}_starts", np.array([channels], np.int64)),
        _constant(f"{tag}_ends", np.array([2 * channels], np.int64)),
        oh.make_node("Slice", [f"{tag}_buffer", f"{tag}_starts", f"{tag}_ends"], [f"{tag}_w"]),
        oh.make_node("Conv", ["x", f"{tag}_w"], [f"{tag}_c"], pads=[1, 1]),
        _constant(f"{tag}_scale", np.full(channels, scale, np.float32)),
        _constant(f"{tag}_shift", RNG.normal(0, 0.5, channels).astype(np.float32)),
        _constant(f"{tag}_mean", RNG.normal(0, 0.5, channels).astype(np.float32)),
        _constant(f"{tag}_var", RNG.uniform(0.5, 2.0, channels).astype(np.float32)),
        oh.make_node(
            "BatchNormalization",
            [f"{tag}_c", f"{tag}_scale", f"{tag}_shift", f"{tag}_mean", f"{tag}_var"],
            [f"{tag}_n"],
        ),
        oh.make_node("Relu", [f"{tag}_n"], [f"{tag}_y"]),
    ]
    return oh.make_graph(nodes, tag, [], [tensor_info(f"{tag}_y", np.float32, [1, 4, 16])])


def _if_model() -> onnx.ModelProto:
    node = oh.make_node(
        "If",
        ["flag"],
        ["y"],
        then_branch=_branch("then", 1.5),
        else_branch=_branch("else", 0.5),
    )
    return make_model(
        [node],
        [tensor_info("flag", np.bool_, []), tensor_info("x", np.float32, [1, 3, 16])],
        [tensor_info("y", np.float32, [1, 4, 16])],
    )


def _body_ops(graph: ir.Graph) -> list[list[str]]:
    node = next(n for n in graph if n.op_type == "If")
    return [
        [n.op_type for n in node.attributes[name].as_graph()]
        for name in ("then_branch", "else_branch")
    ]


def test_if_branches_are_folded_and_fused() -> None:
    model = _if_model()
    ir_model = ir.serde.deserialize_model(model)
    passes = [ConstantFoldingPass(evaluate_node), FoldBatchNormPass(), FuseActivationPass()]
    SubgraphsPass(passes)(ir_model)
    assert _body_ops(ir_model.graph) == [["FusedConv"], ["FusedConv"]]
    assert ir_model.opset_imports.get("ai.aioinfer") == 1  # the fused op's domain


def test_compiled_bodies_are_optimised_and_agree_with_reference() -> None:
    model = _if_model()
    compiled = ai.Core().compile_model(model, "CPU")
    assert _body_ops(compiled.graph) == [["FusedConv"], ["FusedConv"]]
    x = RNG.standard_normal((1, 3, 16)).astype(np.float32)
    for flag in (True, False):
        feeds = {"flag": np.array(flag), "x": x}
        assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-5)


def test_loop_body_constants_fold() -> None:
    """A Loop body's Constant and the arithmetic on it fold; the loop still counts."""
    body = oh.make_graph(
        [
            _constant("two", np.array([2.0], np.float32)),
            _constant("three", np.array([3.0], np.float32)),
            oh.make_node("Mul", ["two", "three"], ["six"]),
            oh.make_node("Add", ["acc_in", "six"], ["acc_out"]),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            tensor_info("i", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("acc_in", np.float32, [1]),
        ],
        [tensor_info("cond_out", np.bool_, []), tensor_info("acc_out", np.float32, [1])],
    )
    model = make_model(
        [oh.make_node("Loop", ["n", "go", "acc"], ["total"], body=body)],
        [
            tensor_info("n", np.int64, []),
            tensor_info("go", np.bool_, []),
            tensor_info("acc", np.float32, [1]),
        ],
        [tensor_info("total", np.float32, [1])],
    )
    compiled = ai.Core().compile_model(model, "CPU")
    loop = next(n for n in compiled.graph if n.op_type == "Loop")
    # (the Identity goes too: the body's condition output is its input)
    assert [n.op_type for n in loop.attributes["body"].as_graph()] == ["Add"]
    feeds = {"n": np.array(4, np.int64), "go": np.array(True), "acc": np.array([1.0], np.float32)}
    want = run_reference(model, feeds)
    assert_close(want, [np.array([25.0], np.float32)], rtol=0, atol=0)
    assert_close(run_compiled(model, feeds), want, rtol=0, atol=0)


def test_weights_a_loop_carries_unchanged_are_constants_in_its_body() -> None:
    """paddle2onnx's Loops carry their weights as pass-through variables: the body reads
    the initial value (an initializer) instead, so its MatMul gets constant, prepacked
    weights; the results equal onnx.reference's (float32: rtol 1e-5, atol 1e-5)."""
    body = oh.make_graph(
        [
            oh.make_node("MatMul", ["h_in", "w_in"], ["p"]),
            oh.make_node("Tanh", ["p"], ["h_out"]),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            tensor_info("i", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("h_in", np.float32, [1, 8]),
            tensor_info("w_in", np.float32, [8, 8]),
        ],
        [
            tensor_info("cond_out", np.bool_, []),
            tensor_info("h_out", np.float32, [1, 8]),
            tensor_info("w_in", np.float32, [8, 8]),  # carried through unchanged
        ],
    )
    model = make_model(
        [oh.make_node("Loop", ["n", "go", "h", "w"], ["h_last", "w_last"], body=body)],
        [
            tensor_info("n", np.int64, []),
            tensor_info("go", np.bool_, []),
            tensor_info("h", np.float32, [1, 8]),
        ],
        [tensor_info("h_last", np.float32, [1, 8])],
        {"w": (RNG.standard_normal((8, 8)) * 0.5).astype(np.float32)},
    )
    compiled = ai.Core().compile_model(model, "CPU")
    loop = next(n for n in compiled.graph if n.op_type == "Loop")
    products = [
        n
        for n in loop.attributes["body"].as_graph()
        if n.op_type in ("MatMul", "Gemm", "FusedMatMul", "FusedGemm")
    ]
    assert len(products) == 1 and products[0].inputs[1].const_value is not None
    feeds = {
        "n": np.array(5, np.int64),
        "go": np.array(True),
        "h": RNG.standard_normal((1, 8)).astype(np.float32),
    }
    assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-5)


def _slanet_like_loop() -> onnx.ModelProto:
    """A decoder Loop as paddle2onnx writes it: the features carried through an
    ``Unsqueeze -> Add(0) -> Squeeze`` assign, the weight carried unchanged, and a body
    that multiplies the two (the same product every iteration) before adding the state."""
    body = oh.make_graph(
        [
            _constant("axis", np.array([0], np.int64)),
            _constant("zero", np.array([0.0], np.float32)),
            oh.make_node("Unsqueeze", ["f_in", "axis"], ["f_wide"]),
            oh.make_node("Add", ["f_wide", "zero"], ["f_added"]),
            oh.make_node("Squeeze", ["f_added", "axis"], ["f_out"]),
            oh.make_node("MatMul", ["f_in", "w_in"], ["projected"]),
            oh.make_node("Add", ["projected", "h_in"], ["mixed"]),
            oh.make_node("Tanh", ["mixed"], ["squashed"]),
            oh.make_node("ReduceMean", ["squashed"], ["h_out"], axes=[1], keepdims=1),
            oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            tensor_info("i", np.int64, []),
            tensor_info("cond_in", np.bool_, []),
            tensor_info("h_in", np.float32, [1, 1, 8]),
            tensor_info("f_in", np.float32, [1, 6, 8]),
            tensor_info("w_in", np.float32, [8, 8]),
        ],
        [
            tensor_info("cond_out", np.bool_, []),
            tensor_info("h_out", np.float32, [1, 1, 8]),
            tensor_info("f_out", np.float32, [1, 6, 8]),
            tensor_info("w_in", np.float32, [8, 8]),
        ],
    )
    return make_model(
        [
            oh.make_node("Relu", ["x"], ["features"]),
            oh.make_node(
                "Loop", ["n", "go", "h", "features", "w"], ["h_last", "f_last", "w_last"], body=body
            ),
        ],
        [
            tensor_info("n", np.int64, []),
            tensor_info("go", np.bool_, []),
            tensor_info("h", np.float32, [1, 1, 8]),
            tensor_info("x", np.float32, [1, 6, 8]),
        ],
        [tensor_info("h_last", np.float32, [1, 1, 8])],
        {"w": (RNG.standard_normal((8, 8)) * 0.5).astype(np.float32)},
        opsets={"": 17},
    )


def test_a_product_of_loop_invariants_is_computed_once_before_the_loop() -> None:
    """The body's MatMul reads only values that never change (once the no-op assign is
    gone): it moves in front of the Loop, unfused with the per-iteration Add. Results
    equal onnx.reference's, with iterations and with none (float32: rtol 1e-5,
    atol 1e-6)."""
    model = _slanet_like_loop()
    compiled = ai.Core().compile_model(model, "CPU")
    main = [n.op_type for n in compiled.graph]
    assert main.index("MatMul") < main.index("Loop")
    loop = next(n for n in compiled.graph if n.op_type == "Loop")
    body = [n.op_type for n in loop.attributes["body"].as_graph()]
    assert not {"MatMul", "FusedMatMul", "Gemm", "FusedGemm"} & set(body), body
    for trips in (4, 0):
        feeds = {
            "n": np.array(trips, np.int64),
            "go": np.array(True),
            "h": RNG.standard_normal((1, 1, 8)).astype(np.float32),
            "x": RNG.standard_normal((1, 6, 8)).astype(np.float32),
        }
        want = run_reference(model, feeds)
        assert_close(run_compiled(model, feeds), want, rtol=1e-5, atol=1e-6)


def test_a_fusion_never_reaches_into_an_enclosing_graph() -> None:
    """A branch adds a bias to a product the main graph computed: the branch's
    MatMul+Add fusion must not take the main graph's MatMul (it is not the branch's to
    remove); the model compiles and agrees with onnx.reference (float32: rtol 1e-5,
    atol 1e-6)."""
    bias = RNG.standard_normal((1, 8)).astype(np.float32)
    then_branch = oh.make_graph(
        [_constant("b", bias), oh.make_node("Add", ["product", "b"], ["out"])],
        "then",
        [],
        [tensor_info("out", np.float32, [2, 8])],
    )
    else_branch = oh.make_graph(
        [oh.make_node("Neg", ["x"], ["negated"])],
        "else",
        [],
        [tensor_info("negated", np.float32, [2, 8])],
    )
    model = make_model(
        [
            oh.make_node("MatMul", ["x", "w"], ["product"]),
            oh.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch),
        ],
        [tensor_info("x", np.float32, [2, 8]), tensor_info("flag", np.bool_, [])],
        [tensor_info("y", np.float32, [2, 8])],
        {"w": RNG.standard_normal((8, 8)).astype(np.float32)},
    )
    for flag in (True, False):
        feeds = {"x": RNG.standard_normal((2, 8)).astype(np.float32), "flag": np.array(flag)}
        assert_close(run_compiled(model, feeds), run_reference(model, feeds), rtol=1e-5, atol=1e-6)
