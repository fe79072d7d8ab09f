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
