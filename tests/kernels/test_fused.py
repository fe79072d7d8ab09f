"""The fused kernels' epilogue: biases, residuals and activations added in place, whole
or split between threads, checked against onnx.reference running the unfused ops
(float32: rtol 1e-5, atol 1e-5)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

from aioinfer.devices.cpu.kernels import fused, parallel
from aioinfer.devices.cpu.kernels.parallel import set_intra_op_threads
from aioinfer.devices.cpu.kernels.registry import make_spec
from aioinfer.transforms.rewrite import AIOINFER_DOMAIN
from tests.kernels._check import run_aioinfer

RNG = np.random.default_rng(11)


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Two intra-op threads; the list records the parts the epilogue ran."""
    seen: list[tuple[int, int]] = []
    run_parallel = fused.run_parallel

    def recording(task: Callable[[int, int], None], total: int, *, work: int) -> None:
        def part(start: int, stop: int) -> None:
            seen.append((start, stop))
            task(start, stop)

        run_parallel(part, total, work=work)

    monkeypatch.setattr(fused, "run_parallel", recording)
    before = parallel._POOL.threads
    set_intra_op_threads(2)
    yield seen
    set_intra_op_threads(before)


def _reference(
    nodes: Sequence[onnx.NodeProto], feeds: dict[str, np.ndarray], output: str
) -> np.ndarray:
    graph = oh.make_graph(
        list(nodes),
        "unfused",
        [
            oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(x.shape))
            for n, x in feeds.items()
        ],
        [oh.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])


def _fused_gemm(feeds: dict[str, np.ndarray]) -> np.ndarray:
    node = oh.make_node(
        "FusedGemm", ["a", "b", "c"], ["y"], domain=AIOINFER_DOMAIN, activation="Relu"
    )
    return run_aioinfer(node, list(feeds.values()), 1)[0]


def test_gemm_bias_and_relu_split_between_threads(parts: list[tuple[int, int]]) -> None:
    """Rows split between two threads, the bias added whole to each; a second call with
    the same shapes and other values (the cached layout) is right too."""
    unfused = [oh.make_node("Gemm", ["a", "b", "c"], ["g"]), oh.make_node("Relu", ["g"], ["y"])]
    for _ in range(2):
        feeds = {
            "a": RNG.standard_normal((64, 32)).astype(np.float32),
            "b": RNG.standard_normal((32, 8192)).astype(np.float32),  # 1M of epilogue work
            "c": RNG.standard_normal(8192).astype(np.float32),
        }
        got = _fused_gemm(feeds)
        np.testing.assert_allclose(got, _reference(unfused, feeds, "y"), rtol=1e-5, atol=1e-5)
    assert sorted(parts) == [(0, 32), (0, 32), (32, 64), (32, 64)]


def test_small_gemm_runs_whole(parts: list[tuple[int, int]]) -> None:
    """A product too small to split is finished in place, without the splitter."""
    unfused = [oh.make_node("Gemm", ["a", "b", "c"], ["g"]), oh.make_node("Relu", ["g"], ["y"])]
    feeds = {
        "a": RNG.standard_normal((3, 4)).astype(np.float32),
        "b": RNG.standard_normal((4, 5)).astype(np.float32),
        "c": RNG.standard_normal((3, 1)).astype(np.float32),  # one bias per row
    }
    got = _fused_gemm(feeds)
    np.testing.assert_allclose(got, _reference(unfused, feeds, "y"), rtol=1e-5, atol=1e-5)
    assert parts == []


def test_conv_bias_and_residual_split_along_channels(parts: list[tuple[int, int]]) -> None:
    """The channel axis is split: the per-channel bias is sliced along with the output,
    the batch-broadcast residual too."""
    feeds = {
        "x": RNG.standard_normal((2, 8, 128, 128)).astype(np.float32),
        "w": RNG.standard_normal((16, 8, 1, 1)).astype(np.float32),
        "b": RNG.standard_normal(16).astype(np.float32),
        "z": RNG.standard_normal((1, 16, 128, 128)).astype(np.float32),
    }
    node = oh.make_node(
        "FusedConv", list(feeds), ["y"], domain=AIOINFER_DOMAIN, activation="Sigmoid"
    )
    got = run_aioinfer(node, list(feeds.values()), 1)[0]
    unfused = [
        oh.make_node("Conv", ["x", "w", "b"], ["c"]),
        oh.make_node("Add", ["c", "z"], ["s"]),
        oh.make_node("Sigmoid", ["s"], ["y"]),
    ]
    np.testing.assert_allclose(got, _reference(unfused, feeds, "y"), rtol=1e-5, atol=1e-5)
    assert sorted(parts) == [(0, 8), (8, 16)]


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((2, 6, 5, 4), (8, 6, 1, 1), {}),  # pointwise
        ((3, 6, 7), (4, 6, 3), {"pads": [1, 1]}),  # 1-D
        ((2, 4, 6, 5), (6, 4, 1, 3), {"pads": [0, 1, 0, 1]}),  # 2-D, small im2col
        ((2, 4, 6, 5), (6, 2, 3, 3), {"group": 2, "strides": [2, 1]}),  # grouped
    ],
)
@pytest.mark.parametrize("z_batch", [1, None])
@pytest.mark.parametrize("with_bias", [True, False])
def test_small_conv_bias_residual_and_activation(
    parts: list[tuple[int, int]],
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    attrs: dict,
    z_batch: int | None,
    with_bias: bool,
) -> None:
    """A convolution whose output is too small to split: bias, residual (of the whole
    batch or broadcast over it) and activation over every image, against
    onnx.reference; nothing is split."""
    conv_node = oh.make_node("Conv", ["x", "w", "b"] if with_bias else ["x", "w"], ["c"], **attrs)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    c = _reference([conv_node], {"x": x, "w": w, "b": b}, "c")
    z = RNG.standard_normal((z_batch or c.shape[0], *c.shape[1:])).astype(np.float32)
    feeds = {"x": x, "w": w, "b": b, "z": z}
    names = ["x", "w", "b" if with_bias else "", "z"]
    node = oh.make_node(
        "FusedConv", names, ["y"], domain=AIOINFER_DOMAIN, activation="Tanh", **attrs
    )
    got = run_aioinfer(node, [x, w, b if with_bias else None, z], 1)[0]
    unfused = [
        conv_node,
        oh.make_node("Add", ["c", "z"], ["s"]),
        oh.make_node("Tanh", ["s"], ["y"]),
    ]
    np.testing.assert_allclose(got, _reference(unfused, feeds, "y"), rtol=1e-5, atol=1e-5)
    assert parts == []


def test_a_term_that_does_not_broadcast_fails_and_the_kernel_stays_usable() -> None:
    node = oh.make_node("FusedMatMul", ["a", "b", "bias"], ["y"], domain=AIOINFER_DOMAIN)
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    with pytest.raises(ValueError, match="broadcast"):
        run_aioinfer(node, [a, b, np.ones(4, np.float32)], 1)
    bias = RNG.standard_normal(5).astype(np.float32)
    got = run_aioinfer(node, [a, b, bias], 1)[0]
    unfused = [oh.make_node("MatMul", ["a", "b"], ["m"]), oh.make_node("Add", ["m", "bias"], ["y"])]
    want = _reference(unfused, {"a": a, "b": b, "bias": bias}, "y")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 128), (1, 1, 96), (3, 128), (1, 4, 64, 300)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_layernorm_matches_onnx_layernormalization(
    shape: tuple[int, ...], with_bias: bool
) -> None:
    """The fused LayerNormalization over the last axis equals onnx.reference's
    LayerNormalization-17 for one row (statistics as Python floats), a few rows and
    enough rows to be split between threads (float32: rtol 1e-5, atol 1e-5)."""
    rng = np.random.default_rng(8)
    width = shape[-1]
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, width).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32)
    inputs = [x, scale, bias] if with_bias else [x, scale]
    names = ["x", "s", "b"][: len(inputs)]
    fused_node = oh.make_node(
        "LayerNormalization", names, ["y"], domain=AIOINFER_DOMAIN, axis=-1, epsilon=1e-5
    )
    (got,) = run_aioinfer(fused_node, inputs, 1)
    onnx_node = oh.make_node("LayerNormalization", names, ["y"], axis=-1, epsilon=1e-5)
    graph = oh.make_graph(
        [onnx_node],
        "ln",
        [
            oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, a.shape)
            for n, a in zip(names, inputs)
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    (want,) = ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("scale_shape", [(128,), (1, 128)])
@pytest.mark.parametrize("planned", [False, True])
def test_fused_layernorm_of_one_row(axis: int, scale_shape: tuple[int, ...], planned: bool) -> None:
    """A 1x128 row (a wake-word head's; the one-row path for a 1-D scale), with the axis
    given either way, a 2-D scale (the general path), into a planned buffer or not,
    against onnx.reference's LayerNormalization-17 (rtol 1e-5, atol 1e-5)."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((1, 128)) * 3 + 1).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, scale_shape).astype(np.float32)
    bias = rng.standard_normal(scale_shape).astype(np.float32)
    node = oh.make_node(
        "LayerNormalization", ["x", "s", "b"], ["y"], domain=AIOINFER_DOMAIN, axis=axis
    )
    spec = make_spec(ir.from_proto(node), 1)
    if planned:
        buffer = np.full((1, 128), np.nan, np.float32)
        (got,) = fused.layer_normalization_into(spec)(buffer, x, scale, bias)
        assert got is buffer
    else:
        (got,) = fused.layer_normalization(spec)(x, scale, bias)
    reference = oh.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=axis)
    graph = oh.make_graph(
        [reference],
        "ln",
        [
            oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, a.shape)
            for n, a in zip("xsb", (x, scale, bias))
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x, "s": scale, "b": bias})
    assert got.shape == (1, 128)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gelu_matches_float64_over_the_whole_float32_range() -> None:
    """The float32 GELU (A&S 7.1.26 for erfc, no sign pass) against
    x/2 (1 + erf(x/sqrt 2)) in float64 (rtol 1e-5, atol 1e-6) from -12 to 12 and at the
    ends of the float32 range (x/2 (1 + erf) overflowed to inf at 3e38), with inf and
    NaN; in place too (the planner may give the input's buffer as the output)."""
    x = np.concatenate(
        [
            np.linspace(-12, 12, 100_001, dtype=np.float32),
            np.float32([3e38, -3e38, 1e-30, -1e-30, 0.0, np.inf, np.nan]),
        ]
    )
    node = oh.make_node("Gelu", ["x"], ["y"], domain=AIOINFER_DOMAIN)
    got = run_aioinfer(node, [x], 1)[0]
    wide = x.astype(np.float64)
    want = wide / 2 * (1 + np.vectorize(math.erf)(wide / math.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    inplace = x.copy()
    fused._gelu_into(inplace, inplace)
    np.testing.assert_array_equal(inplace, got)


def test_gelu_of_an_mlp_layer_splits_between_threads(parts: list[tuple[int, int]]) -> None:
    """GELU (erf) of a 64 x 1024 float32 layer (one chunk of the float32 erf, which ran on
    one thread) runs in two parts of two chunks on two threads, and agrees with
    x/2 (1 + erf(x/sqrt 2)) computed in float64 (rtol 1e-5, atol 1e-6)."""
    x = (RNG.standard_normal((64, 1024)) * 3).astype(np.float32)
    node = oh.make_node("Gelu", ["x"], ["y"], domain=AIOINFER_DOMAIN)
    got = run_aioinfer(node, [x], 1)[0]
    wide = x.astype(np.float64)
    want = wide / 2 * (1 + np.vectorize(math.erf)(wide / math.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sorted(parts) == [(0, 2), (2, 4)]


@pytest.mark.parametrize(
    ("activation", "params", "attributes"),
    [
        ("HardSwish", [], {}),
        ("HardSwish", [6.0], {}),  # six times it (its 1/6 in the next weights)
        ("HardSigmoid", [0.2, 0.5], {"alpha": 0.2, "beta": 0.5}),
    ],
)
def test_hard_activations_at_their_corners(
    activation: str, params: list[float], attributes: dict[str, float]
) -> None:
    """HardSwish and HardSigmoid fused after a product, on values at and around their
    corners (-3 and 3 for HardSwish), infinities and NaN, as onnx.reference's unfused
    operator computes them (float32 rounding of the gate's affine step: rtol 1e-6)."""
    corners = [-np.inf, -100.0, -3.01, -3.0, -2.99, -1e-8, 0.0, 1.5, 2.99, 3.0, 3.01, 100.0]
    values = np.array([[*corners, np.inf, np.nan]], np.float32)
    feeds = {"a": np.ones((1, 1), np.float32), "b": values}  # the product is values
    node = oh.make_node(
        "FusedMatMul",
        ["a", "b"],
        ["y"],
        domain=AIOINFER_DOMAIN,
        activation=activation,
        **({"activation_params": params} if params else {}),
    )
    got = run_aioinfer(node, list(feeds.values()), 1)[0]
    unfused = [
        oh.make_node("MatMul", ["a", "b"], ["m"]),
        oh.make_node(activation, ["m"], ["y"], **attributes),
    ]
    want = _reference(unfused, feeds, "y") * (
        params[0] if activation == "HardSwish" and params else 1
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_swish_epilogue_against_float64() -> None:
    """The Swish (SiLU) epilogue, computed as (y / 2) * (1 + tanh(y / 2)), against
    y * sigmoid(y) in float64 over -40..40, infinities and NaN: float32 rounding (rtol
    1e-6) and, in the negative tail where the result is below 1e-6, an absolute 1e-6;
    -inf gives NaN and inf gives inf, as Mul(x, Sigmoid(x)) does."""
    values = np.concatenate([np.linspace(-40, 40, 801), [-1e-30, 1e-30, 1e4, -1e4]])
    values = np.array([[*values, -np.inf, np.inf, np.nan]], np.float32)
    feeds = [np.ones((1, 1), np.float32), values]
    node = oh.make_node(
        "FusedMatMul", ["a", "b"], ["y"], domain=AIOINFER_DOMAIN, activation="Swish"
    )
    got = run_aioinfer(node, feeds, 1)[0][0]
    wide = values[0].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = wide / (1 + np.exp(-wide))
    want[-3:] = [np.nan, np.inf, np.nan]
    np.testing.assert_allclose(got[:-3], want[:-3], rtol=1e-6, atol=1e-6)
    assert np.isnan(got[-3]) and got[-2] == np.inf and np.isnan(got[-1])


@pytest.mark.parametrize(
    "value", [-np.inf, -200.0, -100.0, -30.0, -1.5, -0.0, 0.0, 0.75, 30.0, 100.0, np.inf, np.nan]
)
def test_sigmoid_of_one_score(value: float) -> None:
    """A FusedGemm of one output (a wake-word classifier's score) and a Sigmoid: the
    one value computed in Python floats, as numpy computes the sigmoid in float64
    rounded to float32 (rtol 1e-7): sigmoid(-100) is the subnormal 3.7e-44, where a
    float32 exp(100) overflowed to a 0.)"""
    a, b = np.ones((1, 1), np.float32), np.array([[value]], np.float32)
    node = oh.make_node(
        "FusedGemm", ["a", "b"], ["y"], domain=AIOINFER_DOMAIN, activation="Sigmoid"
    )
    got = run_aioinfer(node, [a, b], 1)[0]
    wide = np.float64(value)
    with np.errstate(over="ignore"):
        want = np.float32(1 / (1 + np.exp(-wide)))
    assert got.shape == (1, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-7, atol=0)
