"""Small ONNX models for the API and error tests, and a reference runtime to compare with.

The models the conformance suite runs too are built in :mod:`aioinfer.testing.models`
(re-exported here); the others are built here."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
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


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state ``T``). SIGSTOP stops
    a process's threads one after the other: until the thread that takes the signal
    runs, the others may still read and answer a request sent meanwhile."""
    tasks = Path(f"/proc/{pid}/task")
    stats = [(task / "stat").read_text() for task in tasks.iterdir()]
    return all(stat.rpartition(")")[2].split()[0] == "T" for stat in stats)


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


def decoder_model(
    vocab: int = 16,
    width: int = 8,
    *,
    cache: bool = True,
    attention_mask: bool = True,
    position_ids: bool = True,
    slow: int = 0,
    seed: int = 3,
) -> onnx.ModelProto:
    """A one-layer, one-head causal decoder: ``input_ids`` int64 ``[batch, sequence]`` to
    ``logits`` float32 ``[batch, sequence, vocab]``.

    With ``cache``, the keys and values come in as ``past_key`` / ``past_value``
    ``[batch, past_sequence, width]`` and go out concatenated with the new ones along the
    sequence as ``present_key`` / ``present_value`` (``STATEFUL: auto`` pairs them); the
    queries attend causally over past and new positions. ``attention_mask`` int64
    ``[batch, past + sequence]`` masks keys (a wrong length fails the Where);
    ``position_ids`` int64 ``[batch, sequence]`` picks position embeddings. ``slow`` adds
    that many MatMul+Tanh pairs to every step (slow enough to cancel during a step)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {
        "wte": normal(vocab, width),
        "wpe": normal(64, width, scale=2.0),
        "Wq": normal(width, width, scale=width**-0.5),
        "Wk": normal(width, width, scale=width**-0.5),
        "Wv": normal(width, width, scale=width**-0.5),
        "Wout": normal(width, vocab, scale=2.0),
        "Wslow": normal(width, width, scale=width**-0.5),
        "scale": np.array(width**-0.5, np.float32),
        "blocked": np.array(-1e9, np.float32),
        "axis0": np.array([0], np.int64),
        "axis1": np.array([1], np.int64),
        "zero": np.array(0, np.int64),
        "one": np.array(1, np.int64),
    }
    node = oh.make_node
    nodes = [node("Gather", ["wte", "input_ids"], ["tokens"])]
    hidden = "tokens"
    if position_ids:
        nodes += [
            node("Gather", ["wpe", "position_ids"], ["positions"]),
            node("Add", ["tokens", "positions"], ["embedded"]),
        ]
        hidden = "embedded"
    nodes += [node("MatMul", [hidden, w], [n]) for w, n in (("Wq", "q"), ("Wk", "k"), ("Wv", "v"))]
    keys, values = "k", "v"
    if cache:
        nodes += [
            node("Concat", ["past_key", "k"], ["present_key"], axis=1),
            node("Concat", ["past_value", "v"], ["present_value"], axis=1),
        ]
        keys, values = "present_key", "present_value"
    nodes += [
        # Causal: a query at position p (past + i) sees the keys at positions <= p.
        node("Shape", [keys], ["total"], start=1, end=2),
        node("Shape", ["input_ids"], ["sequence"], start=1, end=2),
        node("Sub", ["total", "sequence"], ["past"]),
        node("Squeeze", ["past", "axis0"], ["first"]),
        node("Squeeze", ["total", "axis0"], ["limit"]),
        node("Range", ["first", "limit", "one"], ["query_positions"]),
        node("Range", ["zero", "limit", "one"], ["key_positions"]),
        node("Unsqueeze", ["query_positions", "axis1"], ["query_column"]),
        node("LessOrEqual", ["key_positions", "query_column"], ["causal"]),
    ]
    allowed = "causal"
    if attention_mask:
        nodes += [
            node("Cast", ["attention_mask"], ["mask_bool"], to=onnx.TensorProto.BOOL),
            node("Unsqueeze", ["mask_bool", "axis1"], ["mask_rows"]),
            node("And", ["causal", "mask_rows"], ["allowed"]),
        ]
        allowed = "allowed"
    nodes += [
        node("Transpose", [keys], ["keys_t"], perm=[0, 2, 1]),
        node("MatMul", ["q", "keys_t"], ["qk"]),
        node("Mul", ["qk", "scale"], ["scores"]),
        node("Where", [allowed, "scores", "blocked"], ["masked"]),
        node("Softmax", ["masked"], ["attention"], axis=-1),
        node("MatMul", ["attention", values], ["context"]),
        node("Add", [hidden, "context"], ["h0"]),
    ]
    last = "h0"
    for i in range(slow):
        nodes += [
            node("MatMul", [last, "Wslow"], [f"slow_m{i}"]),
            node("Tanh", [f"slow_m{i}"], [f"h{i + 1}"]),
        ]
        last = f"h{i + 1}"
    nodes.append(node("MatMul", [last, "Wout"], ["logits"]))
    inputs = [tensor_info("input_ids", np.int64, ["batch", "sequence"])]
    if attention_mask:
        inputs.append(tensor_info("attention_mask", np.int64, ["batch", "total_sequence"]))
    if position_ids:
        inputs.append(tensor_info("position_ids", np.int64, ["batch", "sequence"]))
    outputs = [tensor_info("logits", np.float32, ["batch", "sequence", vocab])]
    if cache:
        kv = ["batch", "past_sequence", width]
        inputs += [
            tensor_info("past_key", np.float32, kv),
            tensor_info("past_value", np.float32, kv),
        ]
        present = ["batch", "total_sequence", width]
        outputs += [
            tensor_info("present_key", np.float32, present),
            tensor_info("present_value", np.float32, present),
        ]
    used = {name for n in nodes for name in n.input}
    return make_model(
        nodes, inputs, outputs, {k: v for k, v in weights.items() if k in used}, name="decoder"
    )


def reference_generation(
    model: onnx.ModelProto,
    prompt: Sequence[int],
    count: int,
    pick: Callable[[np.ndarray], int] | None = None,
) -> tuple[list[int], list[np.ndarray]]:
    """``count`` tokens of ``model`` (a :func:`decoder_model`) after ``prompt``, written out
    by hand on onnxruntime: the KV cache fed back explicitly (or the whole sequence for a
    model without one), mask and positions filled for the inputs it has. ``pick(logits)``
    chooses each token (default: argmax). Returns the tokens and each step's last
    logits."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    width = next((i.shape[2] for i in session.get_inputs() if i.name == "past_key"), 0)
    cache = {n: np.zeros((1, 0, width), np.float32) for n in ("past_key", "past_value")}
    sequence, feed, past = list(prompt), list(prompt), 0
    tokens, logits_seen = [], []
    for _ in range(count):
        total = past + len(feed)
        feeds: dict[str, np.ndarray] = {"input_ids": np.array([feed], np.int64)}
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones((1, total), np.int64)
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(past, total, dtype=np.int64)[None]
        if "past_key" in names:
            feeds.update(cache)
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        last = outputs["logits"][0, -1]
        token = int(np.argmax(last)) if pick is None else pick(last)
        tokens.append(token)
        logits_seen.append(last)
        sequence.append(token)
        if "past_key" in names:
            cache = {"past_key": outputs["present_key"], "past_value": outputs["present_value"]}
            past, feed = total, [token]
        else:
            feed = list(sequence)
    return tokens, logits_seen


HF_DECODERS = Path(__file__).parent / "data" / "decoders"
"""Llama decoders with random weights exported by optimum (``scripts/make_decoder.py``):
``llama_gqa`` (4 query heads over 2 KV heads) and ``llama_mha`` (4 and 4), 2 layers,
hidden 64, a 320-token byte-level BPE vocabulary."""


@dataclass(frozen=True)
class GreedyReference:
    """Hugging Face transformers' greedy tokens for one prompt (``NAME.json`` beside the
    decoder's folder)."""

    input_ids: list[int]
    output_ids: list[int]
    """``generate(do_sample=False, max_new_tokens=16)``: the new tokens only."""
    min_logit_gap: float
    """The smallest gap between the two largest logits over those steps."""


def hf_decoder(name: str) -> tuple[Path, list[GreedyReference], tuple[int, ...]]:
    """The folder of decoder ``name`` of :data:`HF_DECODERS` (``model.onnx``, ``config.json``,
    ``generation_config.json``, tokenizer files), transformers' greedy tokens for its
    prompts (1 to 100 tokens), and its end-of-sequence tokens."""
    record = json.loads((HF_DECODERS / f"{name}.json").read_text())
    cases = [
        GreedyReference(case["input_ids"], case["output_ids"], case["min_logit_gap"])
        for case in record["cases"]
    ]
    return HF_DECODERS / name, cases, tuple(record["eos_token_id"])


WORDS = ["<pad>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "it", "and"]
WORDS += ["then", "was", "big", "<unk>"]
"""The vocabulary of :func:`write_tokenizer`: 16 words, :func:`decoder_model`'s
vocabulary size."""


def write_tokenizer(path: Path) -> None:
    """A word-level ``tokenizer.json`` of :data:`WORDS` (split on whitespace) at ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))


async def assert_inline_runs_share_the_loop(
    infer: Callable[[], Awaitable[object]], budget: float, runs: int = 500
) -> None:
    """Infer ``runs`` times in a loop (every run inline) next to a task that counts its
    turns, and check that the loop was given a turn whenever it last had one ``budget``
    seconds or more ago (see aioinfer.plugin.inline). Against the inferring task's own
    clock: over a span ``T`` whose longest gap between two inferences is ``g``, the other
    task must have run at least ``T / (budget + g) - 1`` times, and at least once; a
    loop that never yielded would give it no turn."""
    turns = 0
    done = False

    async def other() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await anyio.sleep(0)

    async with anyio.create_task_group() as group:
        group.start_soon(other)
        await anyio.sleep(0)
        start = turns
        began = last = time.perf_counter()
        gap = 0.0
        for _ in range(runs):
            await infer()
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        done = True
    span, turns = last - began, turns - start
    assert turns > 0 and turns >= span / (budget + gap) - 1, (turns, span, gap)


def replace_compute_stage(request: Any, stage: Callable[[], None], threaded: bool = False) -> None:
    """Make ``stage`` the compute stage (the second) of an AsyncInferRequest's pipeline,
    for tests that watch or interrupt the compute; ``threaded``: always on the device's
    compute thread, never inline on the loop (for a stage that blocks until cancelled)."""
    name, executor, _, committing = request._steps[1]
    if threaded:
        executor = getattr(executor, "_threads", executor)  # a RunExecutor's threads
    request._steps[1] = (name, executor, stage, committing)


def matmul_model(width: int, seed: int = 0) -> onnx.ModelProto:
    """``y = x @ w`` with ``w`` a ``width`` x ``width`` float32 initializer (its bytes:
    ``4 * width**2``): a model whose memory is its weights, for the memory budget."""
    weights = np.random.default_rng(seed).standard_normal((width, width)).astype(np.float32)
    return make_model(
        [oh.make_node("MatMul", ["x", "w"], ["y"])],
        [tensor_info("x", np.float32, ["batch", width])],
        [tensor_info("y", np.float32, ["batch", width])],
        {"w": weights},
        name="matmul",
    )
