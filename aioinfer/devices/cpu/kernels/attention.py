"""Attention kernels: Attention (23-25) and RotaryEmbedding (23).

Attention is scaled dot-product attention over (batch, heads, sequence, head size)
tensors (3-D inputs are split into heads first), with an optional KV cache (past
key/value concatenated in front of K/V), grouped-query heads, and one additive bias
built from the boolean or float mask, the causal and sliding-window frontiers and the
non-padding lengths of an external cache. Those frontiers are *offset-aligned*: query
``i`` sits at absolute position ``i + offset``, where ``offset`` is the past length or,
for an external cache, ``nonpad_kv_seqlen[b] - q_len``. A query row that no key may
attend yields zeros (not NaN). bfloat16 and float8 inputs compute in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from aioinfer.devices.cpu.kernels.normalization import row_sums
from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel

_MODE_AFTER_SOFTCAP = 1
_MODE_WITH_BIAS = 2
_MODE_PROBABILITIES = 3


def _heads(x: np.ndarray, count: int) -> np.ndarray:
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, count, hidden // count).transpose(0, 2, 1, 3)


def _frontier_bias(
    q_len: int,
    kv_len: int,
    offset: int | np.ndarray,
    causal: bool,
    left: int,
    right: int,
    dtype: np.dtype,
) -> np.ndarray | None:
    """0 where query ``i`` may see key ``j`` under the causal / window rules, else -inf;
    (q, kv), or (batch, 1, q, kv) for per-batch offsets. None when no rule applies."""
    if not causal and left < 0 and right < 0:
        return None
    per_batch = np.ndim(offset) > 0
    shift = np.reshape(offset, (-1, 1, 1)) if per_batch else int(offset)
    position = np.arange(q_len).reshape(q_len, 1) + shift
    distance = position - np.arange(kv_len).reshape(1, kv_len)  # query position - key index
    allowed = np.ones(distance.shape, dtype=bool)
    if causal:
        allowed &= distance >= 0
    if left >= 0:
        allowed &= distance <= left
    if right >= 0:
        allowed &= -distance <= right
    bias = np.where(allowed, dtype.type(0), dtype.type(-np.inf))
    return bias[:, None] if per_batch else bias


def _mask_bias(mask: np.ndarray, kv_len: int, dtype: np.dtype) -> np.ndarray:
    """A boolean (True = attend) or additive float mask as an additive bias, padded to
    ``kv_len`` keys with masked positions."""
    if mask.dtype == np.bool_:
        bias = np.where(mask, dtype.type(0), dtype.type(-np.inf))
    else:
        bias = mask.astype(dtype, copy=False)
    missing = kv_len - bias.shape[-1]
    if missing > 0:
        pad = [(0, 0)] * (bias.ndim - 1) + [(0, missing)]
        bias = np.pad(bias, pad, constant_values=-np.inf)
    return bias


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row of -inf gives zeros (see
    :func:`.normalization.softmax_last_axis` for the maximum and the sums)."""
    top = np.fmax.reduce(scores, axis=-1, keepdims=True)
    top = np.where(np.isneginf(top), 0, top)
    e = np.exp(scores - top)
    total = row_sums(e)
    return e / np.where(total == 0, 1, total)


@kernel("Attention", since=23)
def _attention(spec: NodeSpec) -> Kernel:
    scale_attr = spec.attr("scale")
    causal = bool(spec.attr("is_causal", 0))
    q_heads_attr = spec.attr("q_num_heads")
    kv_heads_attr = spec.attr("kv_num_heads")
    softcap = float(spec.attr("softcap", 0.0))
    mode = int(spec.attr("qk_matmul_output_mode", 0))
    precision = spec.attr("softmax_precision")
    left = int(spec.attr("left_window_size", -1))
    right = int(spec.attr("right_window_size", -1))
    if left < -1 or right < -1:
        raise ValueError(f"window sizes must be -1 or nonnegative, got {left} and {right}")
    softmax_dtype = (
        None if precision is None else np.dtype(onnx.helper.tensor_dtype_to_np_dtype(precision))
    )

    def run(
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        mask: np.ndarray | None = None,
        past_key: np.ndarray | None = None,
        past_value: np.ndarray | None = None,
        nonpad_kv_seqlen: np.ndarray | None = None,
    ) -> tuple[Any, ...]:
        if (past_key is None) != (past_value is None):
            raise ValueError("past_key and past_value must be given together")
        if nonpad_kv_seqlen is not None and past_key is not None:
            raise ValueError("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        out_dtype = q.dtype
        packed = q.ndim == 3
        if packed:
            if q_heads_attr is None or kv_heads_attr is None:
                raise ValueError("3-D inputs need the q_num_heads and kv_num_heads attributes")
            q = _heads(q, int(q_heads_attr))
            k = _heads(k, int(kv_heads_attr))
            v = _heads(v, int(kv_heads_attr))
        elif (q_heads_attr is not None or kv_heads_attr is not None) and spec.opset >= 25:
            raise ValueError("q_num_heads and kv_num_heads must not be set for 4-D inputs")
        present_key = k if past_key is None else np.concatenate((past_key, k), axis=2)
        present_value = v if past_value is None else np.concatenate((past_value, v), axis=2)
        work = np.dtype(np.float32) if out_dtype.kind == "V" else out_dtype
        qw, kw, vw = (x.astype(work, copy=False) for x in (q, present_key, present_value))

        q_len, kv_len = qw.shape[2], kw.shape[2]
        scale = scale_attr if scale_attr is not None else 1.0 / np.sqrt(qw.shape[3])
        root = out_dtype.type(np.sqrt(scale)).astype(work)
        if past_key is not None:
            offset: int | np.ndarray = past_key.shape[2]
        elif nonpad_kv_seqlen is not None:
            offset = nonpad_kv_seqlen.reshape(-1).astype(np.int64) - q_len
        else:
            offset = 0
        bias = np.zeros((q_len, kv_len), dtype=work)
        if mask is not None:
            bias = bias + _mask_bias(mask, kv_len, work)
        frontier = _frontier_bias(q_len, kv_len, offset, causal, left, right, work)
        if frontier is not None:
            bias = bias + frontier
        if nonpad_kv_seqlen is not None:
            valid = np.arange(kv_len) < nonpad_kv_seqlen.reshape(-1, 1)
            bias = bias + np.where(valid, work.type(0), work.type(-np.inf))[:, None, None, :]

        repeat = qw.shape[1] // kw.shape[1]
        if repeat > 1:  # grouped-query attention: each KV head serves `repeat` query heads
            kw = np.repeat(kw, repeat, axis=1)
            vw = np.repeat(vw, repeat, axis=1)
        scores = np.matmul(qw * root, np.swapaxes(kw * root, -1, -2))
        if softcap > 0:
            scores = softcap * np.tanh(scores / softcap)
        qk_output = scores
        biased = scores + bias
        if mode == _MODE_WITH_BIAS:
            qk_output = biased
        if softmax_dtype is not None:
            biased = biased.astype(softmax_dtype)
        probabilities = _softmax(biased)
        masked_rows = np.isneginf(np.max(bias, axis=-1, keepdims=True))
        probabilities = np.where(masked_rows, 0, probabilities).astype(work, copy=False)
        if mode == _MODE_PROBABILITIES:
            qk_output = probabilities
        if out_dtype != work:  # round like the operator's output type before the last product
            probabilities = probabilities.astype(out_dtype).astype(work)
        y = np.matmul(probabilities, vw).astype(out_dtype)
        if packed:
            y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], q_len, -1)
        return (y, present_key, present_value, qk_output.astype(out_dtype))

    return run


@kernel("RotaryEmbedding", since=23)
def _rotary_embedding(spec: NodeSpec) -> Kernel:
    interleaved = bool(spec.attr("interleaved", 0))
    rotary_dim_attr = int(spec.attr("rotary_embedding_dim", 0))
    num_heads = int(spec.attr("num_heads", 0))

    def run(
        x: np.ndarray,
        cos_cache: np.ndarray,
        sin_cache: np.ndarray,
        position_ids: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        # Work on (batch, seq, heads, head size).
        if x.ndim == 4:
            work = x.transpose(0, 2, 1, 3)
        else:
            if num_heads <= 0:
                raise ValueError("a 3-D input needs the num_heads attribute")
            batch, seq, hidden = x.shape
            work = x.reshape(batch, seq, num_heads, hidden // num_heads)
        head_size = work.shape[3]
        rotary_dim = rotary_dim_attr or head_size
        half = rotary_dim // 2
        if position_ids is not None:
            cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
        if cos_cache.shape[-1] != half or sin_cache.shape[-1] != half:
            raise ValueError(
                f"the cos/sin caches' last dimension must be rotary_embedding_dim/2 = {half}, "
                f"got {cos_cache.shape[-1]} and {sin_cache.shape[-1]}"
            )
        cos, sin = cos_cache[:, :, None, :], sin_cache[:, :, None, :]
        rotated = work[..., :rotary_dim]
        if interleaved:
            x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
        else:
            x1, x2 = rotated[..., :half], rotated[..., half:]
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        if interleaved:
            rotated = np.stack((real, imag), axis=-1).reshape(rotated.shape)
        else:
            rotated = np.concatenate((real, imag), axis=-1)
        out = np.concatenate((rotated, work[..., rotary_dim:]), axis=-1).astype(x.dtype)
        if x.ndim == 4:
            return (out.transpose(0, 2, 1, 3),)
        return (out.reshape(x.shape),)

    return run
