"""FuseGeluPass: the erf GELU of older exports becomes one Gelu node."""

from __future__ import annotations

import math

import numpy as np
import onnx.helper as oh

from aioinfer.transforms.fuse_gelu import FuseGeluPass
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
