"""Small ONNX models for the API and error tests, and a reference runtime to compare with.

The models the conformance suite runs too are built in :mod:`aioinfer.testing.models`
(re-exported here); the others are built here."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
from prometheus_client.parser import text_string_to_metric_families

from aioinfer.testing.models import (  # noqa: F401  (re-exported for the tests)
    OPSET,
    Dims,
    accumulator_model,
    chain_model,
    make_model,
    mlp_model,
    reshape_model,
    tensor_info,
    two_input_model,
)


def reference_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``model`` on ``feeds`` computed by onnxruntime (CPU)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, dict(feeds)))


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting to be reaped has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def lstm_state_model(features: int = 4, hidden: int = 8, seed: int = 7) -> onnx.ModelProto:
    """One LSTM layer with its state as ports, as exporters write it: ``X [seq, batch,
    features]``, ``h0``/``c0 [1, ?, hidden]`` (the batch dimension unnamed) give ``Y``,
    ``hn`` and ``cn``. ``STATEFUL`` pairs ``{"h0": "hn", "c0": "cn"}``; the variables'
    batch follows ``X``'s."""
    rng = np.random.default_rng(seed)
    weights = {
        "W": (rng.standard_normal((1, 4 * hidden, features)) * 0.5).astype(np.float32),
        "R": (rng.standard_normal((1, 4 * hidden, hidden)) * 0.5).astype(np.float32),
        "B": (rng.standard_normal((1, 8 * hidden)) * 0.5).astype(np.float32),
    }
    node = oh.make_node(
        "LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "hn", "cn"], hidden_size=hidden
    )
    state = [1, None, hidden]
    return make_model(
        [node],
        [
            tensor_info("X", np.float32, ["seq", "batch", features]),
            tensor_info("h0", np.float32, state),
            tensor_info("c0", np.float32, state),
        ],
        [
            tensor_info("Y", np.float32, ["seq", 1, "batch", hidden]),
            tensor_info("hn", np.float32, state),
            tensor_info("cn", np.float32, state),
        ],
        weights,
        name="lstm_state",
    )


def kv_cache_model(width: int = 8, seed: int = 9) -> onnx.ModelProto:
    """A KV-cache-like step: ``present_key = Concat(past_key, x Wk)`` along the sequence
    (``x [batch, 1, width]``, ``past_key [batch, past_sequence, width]``), and ``y``
    attends over ``present_key`` with the query ``x Wq``. ``STATEFUL: auto`` pairs
    ``past_key`` -> ``present_key``; the cache starts empty (``past_sequence`` 0)."""
    rng = np.random.default_rng(seed)
    weights = {
        name: (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        for name in ("Wk", "Wq")
    }
    return make_model(
        [
            oh.make_node("MatMul", ["x", "Wk"], ["k"]),
            oh.make_node("Concat", ["past_key", "k"], ["present_key"], axis=1),
            oh.make_node("MatMul", ["x", "Wq"], ["q"]),
            oh.make_node("Transpose", ["present_key"], ["kt"], perm=[0, 2, 1]),
            oh.make_node("MatMul", ["q", "kt"], ["scores"]),
            oh.make_node("Softmax", ["scores"], ["weights"], axis=-1),
            oh.make_node("MatMul", ["weights", "present_key"], ["y"]),
        ],
        [
            tensor_info("x", np.float32, ["batch", 1, width]),
            tensor_info("past_key", np.float32, ["batch", "past_sequence", width]),
        ],
        [
            tensor_info("y", np.float32, ["batch", 1, width]),
            tensor_info("present_key", np.float32, ["batch", "total_sequence", width]),
        ],
        weights,
        name="kv_cache",
    )


def scrape_metric(url: str, name: str, **labels: str) -> float:
    """A sample of the server's ``/metrics`` at ``url`` (host:port); 0 when absent."""
    text = httpx.get(f"http://{url}/metrics", timeout=60).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition`` until it holds (a hang guard of ``timeout`` seconds); the
    seconds it took."""
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
    return time.perf_counter() - start
