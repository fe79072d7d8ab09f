"""FuseGeluPass: the erf and tanh GELUs of older exports become one Gelu node."""

from __future__ import annotations

import math

import numpy as np
import onnx.helper as oh
import onnx.numpy_helper as onh

from aioinfer.devices.cpu.passes.fuse_activation import FuseActivationPass
from aioinfer.devices.cpu.passes.fuse_gelu import FuseGeluPass
from tests.helpers import make_model, tensor_info
from tests.transforms._util import (
    applied,
    assert_close,
    op_types,
    run_compiled,
    run_ir,
    run_reference,
)

CONSTANTS = {
    "sqrt2": np.array(math.sqrt(2), np.float32),
    "rsqrt2": np.array(math.sqrt(0.5), np.float32),
    "one": np.array(1.0, np.float32),
    "half": np.array(0.5, np.float32),
}


def _model(form: str) -> object:
    if form == "div":  # torch.onnx: x * 0.5 * (1 + erf(x / sqrt 2)), 0.5 applied last
        nodes = [
            oh.make_node("Div", ["x", "sqrt2"], ["u"]),
            oh.make_node("Erf", ["u"], ["e"]),
            oh.make_node("Add", ["e", "one"], ["a"]),
            oh.make_node("Mul", ["x", "a"], ["m"]),
            oh.make_node("Mul", ["m", "half"], ["y"]),
        ]
    else:  # x * 1/sqrt 2 inside, 0.5 * x first
        nodes = [
            oh.make_node("Mul", ["x", "rsqrt2"], ["u"]),
            oh.make_node("Erf", ["u"], ["e"]),
            oh.make_node("Add", ["one", "e"], ["a"]),
            oh.make_node("Mul", ["x", "half"], ["h"]),
            oh.make_node("Mul", ["a", "h"], ["y"]),
        ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [4, 64])],
        [tensor_info("y", np.float32, [4, 64])],
        CONSTANTS,
    )


def test_both_erf_forms_become_gelu() -> None:
    x = (np.random.default_rng(6).standard_normal((4, 64)) * 3).astype(np.float32)
    for form in ("div", "mul"):
        model = _model(form)
        assert op_types(model).count("Mul") >= 2
        after = applied(model, FuseGeluPass())
        assert op_types(after) == ["Gelu"]
        want = run_reference(model, {"x": x})
        # The fused kernel's float32 erf has an absolute error below 1e-6.
        assert_close(run_ir(after, {"x": x}), want, rtol=1e-5, atol=2e-6)
        assert_close(run_compiled(model, {"x": x}), want, rtol=1e-5, atol=2e-6)


def test_a_wrong_constant_is_not_gelu() -> None:
    model = _model("div")
    model.graph.initializer[0].float_data[:] = [1.5]
    model.graph.initializer[0].ClearField("raw_data")
    assert "Gelu" not in op_types(applied(model, FuseGeluPass()))


TANH_CONSTANTS = {
    "cubic": np.array(0.044715, np.float32),
    "k": np.array(math.sqrt(2 / math.pi), np.float32),
    "one": np.ones((1, 1), np.float32),  # broadcasts without growing x
    "half": np.array(0.5, np.float32),
    "three": np.array(3.0, np.float32),
}


def _tanh_model(form: str, source: str = "input") -> object:
    """``x/2 * (1 + tanh(k * (x + 0.044715 x^3)))`` as jax2tf (Magika) and torch.onnx
    write it; ``source="matmul"``: ``x`` is a product (the activation fuses into it)."""
    if form == "jax":  # x * (0.5 * (1 + tanh(k * (x + x * (x * (0.044715 * x))))))
        cube = [
            oh.make_node("Mul", ["cubic", "x"], ["a"]),
            oh.make_node("Mul", ["x", "a"], ["b"]),
            oh.make_node("Mul", ["x", "b"], ["c"]),
        ]
        tail = [
            oh.make_node("Add", ["one", "t"], ["f"]),
            oh.make_node("Mul", ["half", "f"], ["g"]),
            oh.make_node("Mul", ["x", "g"], ["y"]),
        ]
    else:  # torch: 0.5 * x * (1 + tanh(k * (x + 0.044715 * pow(x, 3))))
        cube = [
            oh.make_node("Pow", ["x", "three"], ["p"]),
            oh.make_node("Mul", ["p", "cubic"], ["c"]),
        ]
        tail = [
            oh.make_node("Mul", ["x", "half"], ["h"]),
            oh.make_node("Add", ["t", "one"], ["f"]),
            oh.make_node("Mul", ["h", "f"], ["y"]),
        ]
    nodes = [
        *cube,
        oh.make_node("Add", ["x", "c"], ["d"]),
        oh.make_node("Mul", ["d", "k"], ["e"]),
        oh.make_node("Tanh", ["e"], ["t"]),
        *tail,
    ]
    inputs = [tensor_info("x", np.float32, [4, 64])]
    constants = dict(TANH_CONSTANTS)
    if source == "matmul":
        nodes.insert(0, oh.make_node("MatMul", ["a0", "w"], ["x"]))
        inputs = [tensor_info("a0", np.float32, [4, 32])]
        constants["w"] = np.random.default_rng(8).standard_normal((32, 64)).astype(np.float32)
    return make_model(nodes, inputs, [tensor_info("y", np.float32, [4, 64])], constants)


def test_both_tanh_forms_become_gelu() -> None:
    """Against onnx.reference running the unfused nodes (float32 tanh and a different
    grouping of the cubic term: rtol 1e-5, atol 1e-6)."""
    x = (np.random.default_rng(9).standard_normal((4, 64)) * 3).astype(np.float32)
    x[0, :4] = [-40.0, 40.0, 0.0, -0.0]
    for form in ("jax", "torch"):
        model = _tanh_model(form)
        after = applied(model, FuseGeluPass())
        assert op_types(after) == ["Gelu"], form
        (gelu,) = after.graph
        assert gelu.attributes["approximate"].as_string() == "tanh"
        want = run_reference(model, {"x": x})
        assert_close(run_ir(after, {"x": x}), want, rtol=1e-5, atol=1e-6)
        assert_close(run_compiled(model, {"x": x}), want, rtol=1e-5, atol=1e-6)


def test_tanh_gelu_after_a_product_is_its_epilogue() -> None:
    """The fused tanh GELU after a MatMul becomes the product's ``GeluTanh`` activation
    (the erf one would be wrong by up to 5e-4)."""
    a0 = np.random.default_rng(10).standard_normal((4, 32)).astype(np.float32)
    model = _tanh_model("jax", source="matmul")
    after = applied(model, FuseGeluPass(), FuseActivationPass())
    (fused,) = after.graph
    assert fused.op_type == "FusedMatMul"
    assert fused.attributes["activation"].as_string() == "GeluTanh"
    want = run_reference(model, {"a0": a0})
    assert_close(run_ir(after, {"a0": a0}), want, rtol=1e-5, atol=1e-5)
    assert_close(run_compiled(model, {"a0": a0}), want, rtol=1e-5, atol=1e-5)


def test_a_tanh_gelu_with_another_constant_or_a_shared_step_stays() -> None:
    x = np.random.default_rng(12).standard_normal((4, 64)).astype(np.float32)
    model = _tanh_model("jax")
    model.graph.initializer[0].CopyFrom(onh.from_array(np.array(0.05, np.float32), "cubic"))
    assert "Gelu" not in op_types(applied(model, FuseGeluPass()))
    assert_close(run_compiled(model, {"x": x}), run_reference(model, {"x": x}))
    shared = _tanh_model("torch")
    shared.graph.output.append(tensor_info("t", np.float32, [4, 64]))  # tanh read outside
    assert "Gelu" not in op_types(applied(shared, FuseGeluPass()))
    assert_close(run_compiled(shared, {"x": x}), run_reference(shared, {"x": x}))
