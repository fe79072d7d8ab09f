"""A tiny GPT-style decoder with a KV cache, built with onnx.helper (deterministic weights).

Inputs ``input_ids`` int64 ``[batch, sequence]`` and, per layer ``l``,
``past_key_values.{l}.key`` / ``.value`` float32 ``[batch, heads, past_sequence,
head_dim]``; outputs ``logits`` float32 ``[batch, sequence, vocab]`` and
``present.{l}.key`` / ``.value`` (past and new keys/values concatenated), the names
Hugging Face exporters use. Each layer: pre-LayerNorm causal multi-head attention over
past and new positions, then a SiLU MLP, both residual; learned position embeddings
start at the past length.

The weights are random (seeded). With ``recite=True`` the output head is instead solved
so that greedy decoding continues :data:`SENTENCE` word by word: the example then prints
something readable. A trained model would come from an exporter instead.

    python examples/models/decoder.py decoder.onnx   # writes the reciting model
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

SENTENCE = (
    "aioinfer keeps the kv cache inside each infer request , so every step feeds just one "
    "new token ."
)
VOCABULARY: tuple[str, ...] = ("<pad>", *SENTENCE.split())
"""Word-level tokens: every word of the sentence once (so each has one successor)."""
OPSET = 18
MAX_POSITIONS = 64


def encode(text: str) -> list[int]:
    """Token ids of the words of ``text`` (each must be in :data:`VOCABULARY`)."""
    return [VOCABULARY.index(word) for word in text.split()]


def decode(ids: list[int]) -> str:
    """The words of ``ids``, joined by spaces."""
    return " ".join(VOCABULARY[i] for i in ids)


class _Builder:
    """Collects nodes and initializers with unique names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        self.weights.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def random(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        return self.weight(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: object) -> str:
        self.nodes.append(oh.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def layer_norm(self, x: str, name: str, width: int) -> str:
        gamma = self.weight(f"{name}.gamma", np.ones(width, np.float32))
        beta = self.weight(f"{name}.beta", np.zeros(width, np.float32))
        return self.op("LayerNormalization", [x, gamma, beta], name, axis=-1)

    def linear(self, x: str, name: str, shape: tuple[int, int], scale: float) -> str:
        w = self.random(f"{name}.weight", shape, scale / np.sqrt(shape[0]))
        b = self.random(f"{name}.bias", (shape[1],), 0.02)
        return self.op("Add", [self.op("MatMul", [x, w], f"{name}.matmul"), b], name)


def build_decoder(
    *,
    d_model: int = 32,
    heads: int = 2,
    layers: int = 2,
    seed: int = 0,
    recite: bool = False,
) -> onnx.ModelProto:
    """The decoder as a checked ``onnx.ModelProto``.

    ``recite``: scale the blocks down and solve the output head so that greedy decoding
    continues :data:`SENTENCE` (needs ``d_model >= len(VOCABULARY)``).
    """
    vocab, head_dim = len(VOCABULARY), d_model // heads
    block_scale = 0.05 if recite else 1.0
    b = _Builder(np.random.default_rng(seed))
    token_table = (b.rng.standard_normal((vocab, d_model))).astype(np.float32)
    wte = b.weight("wte", token_table)
    wpe = b.random("wpe", (MAX_POSITIONS, d_model), 0.1 if recite else 0.5)
    axes0, axes1 = (
        b.weight("axes0", np.array([0], np.int64)),
        b.weight("axes1", np.array([1], np.int64)),
    )
    heads_shape = b.weight("heads_shape", np.array([0, 0, heads, head_dim], np.int64))
    model_shape = b.weight("model_shape", np.array([0, 0, d_model], np.int64))
    zero, one = b.weight("zero", np.array(0, np.int64)), b.weight("one", np.array(1, np.int64))
    scale = b.weight("scale", np.array(1 / np.sqrt(head_dim), np.float32))
    blocked = b.weight("blocked", np.array(-1e9, np.float32))

    # Positions of the new tokens: past_length ... past_length + sequence - 1.
    past_length = b.op("Shape", ["past_key_values.0.key"], "past_length", start=2, end=3)
    sequence = b.op("Shape", ["input_ids"], "sequence", start=1, end=2)
    total = b.op("Add", [past_length, sequence], "total")
    start = b.op("Squeeze", [past_length, axes0], "start")
    limit = b.op("Squeeze", [total, axes0], "limit")
    positions = b.op("Range", [start, limit, one], "positions")
    # Causal mask [sequence, total]: a new token sees the past and the new tokens up to it.
    keys = b.op("Range", [zero, limit, one], "key_positions")
    queries = b.op("Unsqueeze", [positions, axes1], "query_positions")
    allowed = b.op("LessOrEqual", [keys, queries], "allowed")

    tokens = b.op("Gather", [wte, "input_ids"], "tokens")
    h = b.op("Add", [tokens, b.op("Gather", [wpe, positions], "position_embeddings")], "h0")
    past_inputs, present_outputs = [], []
    for layer in range(layers):
        p = f"layer{layer}"
        x = b.layer_norm(h, f"{p}.ln1", d_model)
        qkv = b.linear(x, f"{p}.qkv", (d_model, 3 * d_model), 1.0)
        b.nodes.append(
            oh.make_node("Split", [qkv], [f"{p}.q", f"{p}.k", f"{p}.v"], axis=-1, num_outputs=3)
        )
        q, k, v = (
            b.op(
                "Transpose",
                [b.op("Reshape", [f"{p}.{n}", heads_shape], f"{p}.{n}.heads")],
                f"{p}.{n}.bhsd",
                perm=[0, 2, 1, 3],
            )
            for n in "qkv"
        )
        past_k, past_v = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
        present_k = b.op("Concat", [past_k, k], f"present.{layer}.key", axis=2)
        present_v = b.op("Concat", [past_v, v], f"present.{layer}.value", axis=2)
        past_inputs += [past_k, past_v]
        present_outputs += [present_k, present_v]
        keys_t = b.op("Transpose", [present_k], f"{p}.keys_t", perm=[0, 1, 3, 2])
        scores = b.op("Mul", [b.op("MatMul", [q, keys_t], f"{p}.qk"), scale], f"{p}.scores")
        masked = b.op("Where", [allowed, scores, blocked], f"{p}.masked")
        probs = b.op("Softmax", [masked], f"{p}.probs", axis=-1)
        context = b.op("MatMul", [probs, present_v], f"{p}.context")
        merged = b.op(
            "Reshape",
            [b.op("Transpose", [context], f"{p}.context_t", perm=[0, 2, 1, 3]), model_shape],
            f"{p}.merged",
        )
        h = b.op(
            "Add",
            [h, b.linear(merged, f"{p}.attn_out", (d_model, d_model), block_scale)],
            f"{p}.h_attn",
        )
        x = b.layer_norm(h, f"{p}.ln2", d_model)
        up = b.linear(x, f"{p}.mlp_up", (d_model, 4 * d_model), 1.0)
        act = b.op("Mul", [up, b.op("Sigmoid", [up], f"{p}.gate")], f"{p}.silu")
        h = b.op(
            "Add",
            [h, b.linear(act, f"{p}.mlp_down", (4 * d_model, d_model), block_scale)],
            f"{p}.h",
        )
    final = b.layer_norm(h, "ln_f", d_model)
    head = _reciting_head(token_table) if recite else b.rng.standard_normal((d_model, vocab))
    b.op("MatMul", [final, b.weight("lm_head", head.astype(np.float32))], "logits")

    kv_shape = ["batch", heads, "past_sequence", head_dim]
    graph = oh.make_graph(
        b.nodes,
        "tiny_decoder",
        [oh.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])]
        + [oh.make_tensor_value_info(n, TensorProto.FLOAT, kv_shape) for n in past_inputs],
        [oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])]
        + [
            oh.make_tensor_value_info(
                n, TensorProto.FLOAT, ["batch", heads, "total_sequence", head_dim]
            )
            for n in present_outputs
        ],
        b.weights,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _reciting_head(token_table: np.ndarray) -> np.ndarray:
    """An output head under which each word's embedding scores its successor highest.

    The blocks add little to the residual stream in the reciting model, so the final
    LayerNorm sees mostly the token embedding: solve ``norm(E) @ head = targets``.
    """
    centered = token_table - token_table.mean(axis=1, keepdims=True)
    normed = centered / np.sqrt((centered**2).mean(axis=1, keepdims=True) + 1e-5)
    targets = np.zeros((len(VOCABULARY), len(VOCABULARY)))
    for index in range(1, len(VOCABULARY)):
        targets[index, index % (len(VOCABULARY) - 1) + 1] = 10.0
    head, *_ = np.linalg.lstsq(normed, targets, rcond=None)
    return head


if __name__ == "__main__":
    onnx.save(build_decoder(recite=True), sys.argv[1] if len(sys.argv) > 1 else "decoder.onnx")
