"""Export small PyTorch models with PyTorch's own exporter, as test data of real exports.

``torch.onnx.export`` writes the graphs users bring: literals as ``Constant`` nodes,
shapes computed with ``Shape``/``Gather``/``Concat``, PyTorch's names. The tests of
AUTO's choice (``tests/devices/auto/test_auto_device.py``) run on these files. Weights come from
fixed seeds, so the files change only with torch's exporter. Needs torch, onnx and
onnxscript (not aioinfer's dependencies)::

    python scripts/make_torch_exports.py               # writes tests/data/torch_exports/
    python scripts/make_torch_exports.py --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
import torch
from torch import nn

SEED = 20261207
OPSET = 17
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "torch_exports"


class MLP(nn.Module):
    """[batch, 16] -> [batch, 8]: two linear layers with a GELU between them."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class LSTMTagger(nn.Module):
    """[batch, steps, 8] -> [batch, steps, 4]: one LSTM layer (hidden 16), then a
    linear head on each step."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out)


class EncoderBlock(nn.Module):
    """[batch, tokens, 32] -> [batch, tokens, 32]: one transformer encoder layer (4
    heads, feed-forward 64, GELU), as in a small BERT."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            32, 4, dim_feedforward=64, dropout=0.0, activation="gelu", batch_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


MODELS: dict[str, tuple[type[nn.Module], tuple[int, ...], dict[int, str]]] = {
    "mlp": (MLP, (2, 16), {0: "batch"}),
    "lstm": (LSTMTagger, (2, 5, 8), {0: "batch", 1: "steps"}),
    "encoder": (EncoderBlock, (2, 6, 32), {0: "batch"}),
}
"""name -> (module, example input shape, the input's and output's dynamic axes). The
TorchScript exporter writes the encoder's token count into its attention's Reshape
nodes, so only its batch is dynamic."""


def export(name: str, out: Path) -> Path:
    """Export model ``name`` of :data:`MODELS` to ``out/name.onnx`` with the TorchScript
    exporter, which writes literals as ``Constant`` nodes; return the path."""
    module_class, shape, axes = MODELS[name]
    torch.manual_seed(SEED)
    module = module_class().eval()
    example = torch.randn(*shape)
    path = out / f"{name}.onnx"
    torch.onnx.export(
        module,
        (example,),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": axes, "y": axes},
        opset_version=OPSET,
        dynamo=False,
    )
    onnx.checker.check_model(onnx.load(path), full_check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        path = export(name, args.out)
        graph = onnx.load(path).graph
        constants = sum(node.op_type == "Constant" for node in graph.node)
        print(f"{path}: {len(graph.node)} nodes, {constants} Constant, {path.stat().st_size} B")


if __name__ == "__main__":
    main()
