"""Generate the models bundled with aioinfer (``aioinfer/models/*.onnx``).

The output is reproducible: a fixed seed and deterministic serialisation, so running the
script twice writes byte-identical files. Usage::

    python scripts/make_models.py            # writes aioinfer/models/tiny_cnn.onnx
    python scripts/make_models.py --check    # ... and verifies it with onnx and onnxruntime
    python scripts/make_models.py --out DIR  # writes into DIR instead
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
"""The IR version that goes with opset 17, so older runtimes load the file too."""
SEED = 20240611
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "aioinfer" / "models"


def he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """He (Kaiming) normal initialisation for a layer followed by ReLU."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def tiny_cnn() -> onnx.ModelProto:
    """A small image classifier: [batch, 3, 32, 32] images -> [batch, 10] probabilities.

    conv3x3(3->16)+BN+ReLU, conv3x3/2(16->32)+ReLU, maxpool 2x2, conv1x1(32->32) + residual
    + ReLU, global average pool, flatten, gemm(32->10), softmax.
    """
    rng = np.random.default_rng(SEED)
    weights = {
        "conv1.weight": he_normal(rng, (16, 3, 3, 3), 3 * 9),
        "conv1.bias": np.zeros(16, np.float32),
        "bn1.scale": (1.0 + 0.1 * rng.standard_normal(16)).astype(np.float32),
        "bn1.bias": (0.1 * rng.standard_normal(16)).astype(np.float32),
        "bn1.mean": (0.1 * rng.standard_normal(16)).astype(np.float32),
        "bn1.var": rng.uniform(0.5, 1.5, 16).astype(np.float32),
        "conv2.weight": he_normal(rng, (32, 16, 3, 3), 16 * 9),
        "conv2.bias": (0.01 * rng.standard_normal(32)).astype(np.float32),
        "conv3.weight": he_normal(rng, (32, 32, 1, 1), 32),
        "conv3.bias": (0.01 * rng.standard_normal(32)).astype(np.float32),
        "fc.weight": he_normal(rng, (10, 32), 32),
        "fc.bias": (0.01 * rng.standard_normal(10)).astype(np.float32),
    }
    nodes = [
        helper.make_node(
            "Conv",
            ["image", "conv1.weight", "conv1.bias"],
            ["conv1"],
            name="conv1",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node(
            "BatchNormalization",
            ["conv1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"],
            ["bn1"],
            name="bn1",
            epsilon=1e-5,
        ),
        helper.make_node("Relu", ["bn1"], ["relu1"], name="relu1"),
        helper.make_node(
            "Conv",
            ["relu1", "conv2.weight", "conv2.bias"],
            ["conv2"],
            name="conv2",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        ),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node(
            "MaxPool", ["relu2"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node(
            "Conv",
            ["pool", "conv3.weight", "conv3.bias"],
            ["conv3"],
            name="conv3",
            kernel_shape=[1, 1],
        ),
        helper.make_node("Add", ["conv3", "pool"], ["residual"], name="residual"),
        helper.make_node("Relu", ["residual"], ["relu3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["relu3"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["features"], name="flatten", axis=1),
        helper.make_node(
            "Gemm", ["features", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1
        ),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(array, name) for name, array in weights.items()],
        doc_string="A tiny randomly initialised CNN classifier (aioinfer's default model).",
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="aioinfer scripts/make_models.py",
    )


MODELS = {"tiny_cnn.onnx": tiny_cnn}


def check(path: Path) -> None:
    """Check ``path`` with onnx's full checker and run it with onnxruntime."""
    import onnxruntime

    onnx.checker.check_model(str(path), full_check=True)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    image = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    (probabilities,) = session.run(None, {"image": image})
    if probabilities.shape != (2, 10) or probabilities.dtype != np.float32:
        raise SystemExit(f"{path}: unexpected output {probabilities.dtype}{probabilities.shape}")
    if not np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5):
        raise SystemExit(f"{path}: probabilities do not sum to 1: {probabilities.sum(axis=1)}")


def main(argv: list[str] | None = None) -> int:
    """Write every bundled model into ``--out``; verify them with ``--check``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--check", action="store_true", help="verify with onnx and onnxruntime")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for filename, build in MODELS.items():
        path = args.out / filename
        path.write_bytes(build().SerializeToString(deterministic=True))
        if args.check:
            check(path)
        print(f"wrote {path} ({path.stat().st_size} bytes){' - checked' if args.check else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
