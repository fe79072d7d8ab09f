"""Real-model cases from the onnx package that the CPU device cannot run yet.

``test_models.py`` asserts that each case listed here still fails (a listed case that
passes fails the test: remove it from this dict) and that every other case passes.
Keys are the test ids of ``test_models.py`` (the case's directory or file name).
"""

from __future__ import annotations

_SEQUENCES = "sequence types and Sequence* operators are not supported"
_STRINGS = "StringNormalizer (string tensors) is not supported"
_GRADIENT = "ai.onnx.preview.training::Gradient (training) is not supported"

EXPECTED_FAILURES: dict[str, str] = {
    "test_gradient_of_add": _GRADIENT,
    "test_gradient_of_add_and_mul": _GRADIENT,
    **{f"test_sequence_model{i}": _SEQUENCES for i in range(1, 9)},
    "test_strnorm_model_monday_casesensintive_lower": _STRINGS,
    "test_strnorm_model_monday_casesensintive_nochangecase": _STRINGS,
    "test_strnorm_model_monday_casesensintive_upper": _STRINGS,
    "test_strnorm_model_monday_empty_output": _STRINGS,
    "test_strnorm_model_monday_insensintive_upper_twodim": _STRINGS,
    "test_strnorm_model_nostopwords_nochangecase": _STRINGS,
}
