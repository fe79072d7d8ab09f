"""Random generators: shapes, dtypes, seeds and distributions (moments within 5 standard
errors of 20,000 draws; the values themselves match no other runtime)."""

from __future__ import annotations

import numpy as np
import onnx.helper as oh
from onnx import TensorProto as TP

from tests.kernels._check import run_aioinfer

DRAWS = 20_000


def test_random_normal_and_uniform() -> None:
    normal = oh.make_node("RandomNormal", [], ["y"], shape=[DRAWS], mean=2.0, scale=3.0)
    (y,) = run_aioinfer(normal, [], 22)
    assert y.dtype == np.float32 and y.shape == (DRAWS,)
    assert abs(y.mean() - 2) < 5 * 3 / np.sqrt(DRAWS) and abs(y.std() - 3) < 0.15
    uniform = oh.make_node("RandomUniform", [], ["y"], shape=[DRAWS], low=-1.0, high=3.0, dtype=11)
    (u,) = run_aioinfer(uniform, [], 22)
    assert u.dtype == np.float64 and u.min() >= -1 and u.max() < 3
    assert abs(u.mean() - 1) < 5 * (4 / np.sqrt(12)) / np.sqrt(DRAWS)


def test_like_variants_follow_the_input() -> None:
    x = np.zeros((3, 4), np.float16)
    (y,) = run_aioinfer(oh.make_node("RandomNormalLike", ["x"], ["y"]), [x], 22)
    assert y.shape == (3, 4) and y.dtype == np.float16
    (z,) = run_aioinfer(oh.make_node("RandomUniformLike", ["x"], ["y"], dtype=TP.DOUBLE), [x], 22)
    assert z.shape == (3, 4) and z.dtype == np.float64


def test_seed_makes_runs_repeat_and_no_seed_differs() -> None:
    seeded = oh.make_node("RandomUniform", [], ["y"], shape=[8], seed=5.0)
    assert np.array_equal(run_aioinfer(seeded, [], 22)[0], run_aioinfer(seeded, [], 22)[0])
    free = oh.make_node("RandomUniform", [], ["y"], shape=[8])
    assert not np.array_equal(run_aioinfer(free, [], 22)[0], run_aioinfer(free, [], 22)[0])


def test_bernoulli() -> None:
    p = np.full(DRAWS, 0.3)
    (y,) = run_aioinfer(oh.make_node("Bernoulli", ["p"], ["y"], dtype=TP.INT32), [p], 22)
    assert y.dtype == np.int32 and set(np.unique(y)) <= {0, 1}
    assert abs(y.mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / DRAWS)
    (edges,) = run_aioinfer(oh.make_node("Bernoulli", ["p"], ["y"]), [np.float32([0, 1])], 22)
    assert edges.dtype == np.float32 and edges.tolist() == [0, 1]


def test_multinomial() -> None:
    probabilities = np.array([[0.1, 0.6, 0.3], [1.0, 0.0, 0.0]])
    logits = np.log(probabilities + 1e-30).astype(np.float32)
    node = oh.make_node("Multinomial", ["x"], ["y"], sample_size=DRAWS, dtype=TP.INT64)
    (y,) = run_aioinfer(node, [logits], 22)
    assert y.shape == (2, DRAWS) and y.dtype == np.int64
    counts = np.bincount(y[0], minlength=3) / DRAWS
    np.testing.assert_allclose(counts, probabilities[0], atol=5 * np.sqrt(0.25 / DRAWS))
    assert (y[1] == 0).all()
