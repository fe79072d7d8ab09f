"""Real-model cases from the onnx package that the CPU device cannot run yet.

``test_models.py`` asserts that each case listed here still fails (a listed case that
passes fails the test: remove it from this dict) and that every other case passes.
Keys are the test ids of ``test_models.py`` (the case's directory or file name).
"""

from __future__ import annotations

_GRADIENT = "ai.onnx.preview.training::Gradient (training) is not supported"

EXPECTED_FAILURES: dict[str, str] = {
    "test_gradient_of_add": _GRADIENT,
    "test_gradient_of_add_and_mul": _GRADIENT,
}


TIED_OUTPUTS: dict[str, str] = {
    "light_squeezenet": (
        "its 1000 logits are equal in exact arithmetic and about 9.5e9 (ulp 1024): the "
        "uniform softmax it expects needs every class to round alike, which BLAS's "
        "row blocking does not give (it passed only with OpenBLAS's own 2-thread "
        "partition, and failed with one thread)"
    ),
}
"""Light models whose expected output is a softmax over exactly tied, huge logits: their
outputs are checked for shape, dtype, finiteness and summing to one, not value by value."""


def check_tied_softmax(got: object, want: object) -> None:
    """The check of a :data:`TIED_OUTPUTS` case's output."""
    import numpy as np

    got_array, want_array = np.asarray(got), np.asarray(want)
    assert got_array.shape == want_array.shape and got_array.dtype == want_array.dtype
    assert np.isfinite(got_array).all() and (got_array >= 0).all()
    np.testing.assert_allclose(got_array.reshape(got_array.shape[0], -1).sum(axis=1), 1, rtol=1e-4)
