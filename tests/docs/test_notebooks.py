"""The notebooks of examples/notebooks/ are stored without outputs and run from top to
bottom in a fresh Jupyter kernel (nbclient), with the results they claim."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from aioinfer.models import default_model_path
from tests.helpers import reference_outputs

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "examples" / "notebooks"
NAMES = ["quickstart.ipynb", "async_throughput.ipynb", "stateful_generation.ipynb"]


def execute(name: str, tmp_path: Path) -> Any:
    """Run the notebook in a fresh kernel (over IPC sockets in ``tmp_path``, not TCP)."""
    from jupyter_client.manager import KernelManager

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    manager = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp_path / "kernel"))
    client = nbclient.NotebookClient(
        notebook, km=manager, timeout=180, resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError naming the cell when one fails
    return notebook


def text_of(notebook: Any) -> str:
    """Everything the code cells printed or displayed as text."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name: str) -> None:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def test_quickstart(tmp_path: Path) -> None:
    out = text_of(execute("quickstart.ipynb", tmp_path))
    assert "inputs:  ['image: float[batch, 3, 32, 32]']" in out
    images = np.zeros((3, 3, 32, 32), np.float32)
    images[0], images[1], images[2, 0] = 3.0, -3.0, -2.0
    (expected,) = reference_outputs(onnx.load(default_model_path()), {"image": images})
    classes = expected.argmax(axis=1).tolist()
    assert f"top-1 classes: {np.array(classes)}" in out
    assert "after wait: RequestState.IDLE [('job-1', (1, 10))]" in out
    assert "cancelled: True | state: RequestState.IDLE | InferCancelledError(" in out
    assert str(dict(enumerate(classes))) in out  # the queue's callback saw every job


def test_async_throughput(tmp_path: Path) -> None:
    notebook = execute("async_throughput.ipynb", tmp_path)
    out = text_of(notebook)
    rates = re.search(r"\{'LATENCY': \[([\d, ]+)\], 'THROUGHPUT': \[([\d, ]+)\]\}", out)
    assert rates is not None, out
    for group in rates.groups():
        assert len(group.split(",")) == 4 and all(int(v) > 0 for v in group.split(","))
    images = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 1  # the plot
    assert re.search(r"loop lag over \d+ ticks: median [\d.]+ ms, p99 [\d.]+ ms", out)


def test_stateful_generation(tmp_path: Path) -> None:
    out = text_of(execute("stateful_generation.ipynb", tmp_path))
    assert "inputs:    ['input_ids: int64[batch, sequence]']" in out
    assert "aioinfer keeps the kv cache inside each infer request , so every step feeds" in out
    # 2 prompt tokens + 11 fed back: the cache holds 13 positions.
    assert re.search(r"past_key_values\.0\.key +\(1, 2, 13, 16\)", out)
    assert "cancelled: True | request: RequestState.IDLE\ncache unchanged: True" in out
    assert "'the kv cache': 'inside each infer request ,'" in out
    assert "'every step feeds': 'just one new token .'" in out
