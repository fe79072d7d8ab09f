"""Random generators: RandomNormal, RandomUniform (and their *Like forms), Bernoulli and
Multinomial.

With a ``seed`` attribute every run draws the same values (a generator seeded afresh per
run); without, each kernel owns one generator seeded from the OS, so runs differ. The
values match no other runtime's; the distributions do. Constant folding never folds
these operators.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel


def _generator_source(spec: NodeSpec) -> Callable[[], np.random.Generator]:
    """A function returning the generator of one run (see the module docstring)."""
    seed = spec.attr("seed")
    if seed is not None:
        # The seed is a float attribute; its bits make the integer seed.
        bits = int(np.float32(seed).view(np.uint32))
        return lambda: np.random.default_rng(bits)
    shared = np.random.default_rng()
    return lambda: shared


def _dtype(spec: NodeSpec, default: np.dtype | None) -> np.dtype | None:
    """The ``dtype`` attribute as numpy, or ``default`` when it is not set."""
    code = spec.attr("dtype")
    if code is None:
        return default
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(code)))


Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]
"""``draw(generator, shape)``: values of one distribution."""


def _normal(spec: NodeSpec) -> Draw:
    mean = float(spec.attr("mean", 0.0))
    scale = float(spec.attr("scale", 1.0))
    return lambda rng, shape: rng.normal(mean, scale, shape)


def _uniform(spec: NodeSpec) -> Draw:
    low = float(spec.attr("low", 0.0))
    high = float(spec.attr("high", 1.0))
    return lambda rng, shape: rng.uniform(low, high, shape)


def _register(op_type: str, draw_of: Callable[[NodeSpec], Draw]) -> None:
    def fixed(spec: NodeSpec) -> Kernel:
        shape = tuple(int(d) for d in spec.attr("shape", []))
        dtype = _dtype(spec, np.dtype(np.float32))
        generator, draw = _generator_source(spec), draw_of(spec)
        return lambda: (np.asarray(draw(generator(), shape), dtype=dtype),)

    def like(spec: NodeSpec) -> Kernel:
        dtype = _dtype(spec, None)
        generator, draw = _generator_source(spec), draw_of(spec)

        def run(x: np.ndarray) -> tuple[np.ndarray]:
            return (np.asarray(draw(generator(), x.shape), dtype=dtype or x.dtype),)

        return run

    kernel(op_type, since=1)(fixed)
    kernel(f"{op_type}Like", since=1)(like)


_register("RandomNormal", _normal)
_register("RandomUniform", _uniform)


@kernel("Bernoulli", since=15)
def _bernoulli(spec: NodeSpec) -> Kernel:
    """1 with probability ``p`` (the input), else 0."""
    dtype = _dtype(spec, None)
    generator = _generator_source(spec)

    def run(p: np.ndarray) -> tuple[np.ndarray]:
        draws = generator().uniform(0.0, 1.0, p.shape) < p
        return (draws.astype(dtype or p.dtype),)

    return run


@kernel("Multinomial", since=7)
def _multinomial(spec: NodeSpec) -> Kernel:
    """``sample_size`` class indices per batch row of unnormalized log-probabilities."""
    samples = int(spec.attr("sample_size", 1))
    dtype = _dtype(spec, np.dtype(np.int32))
    generator = _generator_source(spec)

    def run(logits: np.ndarray) -> tuple[np.ndarray]:
        shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
        cumulative = np.cumsum(np.exp(shifted), axis=1)
        cumulative /= cumulative[:, -1:]
        draws = generator().uniform(0.0, 1.0, (logits.shape[0], samples))
        picks = np.stack(
            [np.searchsorted(row, u, side="right") for row, u in zip(cumulative, draws)]
        )
        return (np.minimum(picks, logits.shape[1] - 1).astype(dtype),)

    return run
