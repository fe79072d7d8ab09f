"""Loss kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Inputs are scores ``(N, C, d1, ...)`` and class targets ``(N, d1, ...)``. Each target
picks ``-score[n, target, d...]``, times the class weight when ``weight`` is given;
targets equal to ``ignore_index`` contribute 0 and, for ``reduction="mean"``, do not
count. ``mean`` divides by the sum of the weights that applied.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


def _loss_reducer(spec: NodeSpec) -> Callable[..., np.ndarray]:
    """``loss(log_prob, target, weight)`` for the node's reduction and ignore_index."""
    reduction = spec.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    ignore_index = spec.attr("ignore_index")

    def loss(log_prob: np.ndarray, target: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
        classes = log_prob.shape[1]
        kept = np.ones(target.shape, dtype=bool)
        if ignore_index is not None:
            kept = target != ignore_index
        index = np.where(kept, target, 0)
        if ((index < 0) | (index >= classes)).any():
            raise ValueError(f"targets must be class indices in [0, {classes})")
        picked = np.take_along_axis(log_prob, np.expand_dims(index, 1), axis=1)[:, 0]
        weights = np.where(kept, 1, 0).astype(log_prob.dtype)
        if weight is not None:
            weights = weights * weight[index]
        values = -picked * weights
        if reduction == "none":
            return values
        if reduction == "sum":
            return np.asarray(values.sum(), dtype=log_prob.dtype)
        return np.asarray(values.sum() / weights.sum(), dtype=log_prob.dtype)

    return loss


@kernel("NegativeLogLikelihoodLoss", since=12)
def _negative_log_likelihood_loss(spec: NodeSpec) -> Kernel:
    loss = _loss_reducer(spec)

    def run(
        x: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None
    ) -> tuple[np.ndarray]:
        return (loss(x, target, weight),)

    return run


@kernel("SoftmaxCrossEntropyLoss", since=12)
def _softmax_cross_entropy_loss(spec: NodeSpec) -> Kernel:
    """The loss of the log-softmax over the class axis; the optional second output is
    that log-softmax."""
    loss = _loss_reducer(spec)

    def run(
        scores: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        shifted = scores - scores.max(axis=1, keepdims=True)
        log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return (loss(log_prob, target, weight), log_prob)

    return run
