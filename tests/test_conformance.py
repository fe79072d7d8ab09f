"""ONNX's official node conformance cases, run through ``aioinfer.backend``.

``onnx.backend.test.case.node.collect_testcases()`` builds every case of the pinned onnx
package in memory (a one-node model, or its function expanded, with inputs and expected
outputs). Each runs like ONNX's backend runner runs it: ``prepare`` then ``run`` on the
inputs by position, outputs compared by :func:`assert_similar` (the runner's rules: same
count, shape and dtype, values within the case's rtol/atol, rtol 1e-3 and atol 1e-7 for
every case today; bfloat16 within two ulps; NaN equals NaN; strings exactly; sequences
item by item; an empty optional is None).

Nondeterministic cases (random draws) are checked for shape, dtype and the values they
can take instead (:data:`NONDETERMINISTIC`). A case listed in
``conformance_expected_failures.EXPECTED_FAILURES`` must fail; any other must pass.

The model sets under ``onnx/backend/test/data`` (loaded by ``test_models.py``) run through
the same backend at the end of this module.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.case.test_case import TestCase

import aioinfer.backend as backend
from tests.conformance_expected_failures import EXPECTED_FAILURES
from tests.model_expectations import EXPECTED_FAILURES as MODEL_EXPECTED_FAILURES
from tests.model_expectations import TIED_OUTPUTS, check_tied_softmax
from tests.test_models import CASES as MODEL_CASES
from tests.test_models import ModelCase, data_sets

with warnings.catch_warnings():  # some generators overflow on purpose (saturating casts)
    warnings.simplefilter("ignore")
    CASES: list[TestCase] = collect_testcases()

BFLOAT16_RTOL = 2**-6
"""Two bfloat16 ulps, the runner's tolerance for bfloat16 outputs."""


def as_value(item: Any) -> Any:
    """A case's input or output as the runner feeds it (TensorProto -> ndarray)."""
    if isinstance(item, onnx.TensorProto):
        return numpy_helper.to_array(item)
    return item


def assert_similar(expected: Any, got: Any, rtol: float, atol: float, where: str) -> None:
    """Assert ``got`` matches ``expected`` by the backend runner's rules (module doc)."""
    if expected is None:
        assert got is None, f"{where}: expected an empty optional, got {type(got).__name__}"
        return
    if isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)), f"{where}: expected a sequence, got {type(got)}"
        assert len(got) == len(expected), f"{where}: {len(got)} items, want {len(expected)}"
        for index, (want, item) in enumerate(zip(expected, got)):
            assert_similar(want, item, rtol, atol, f"{where}[{index}]")
        return
    assert isinstance(got, np.ndarray), f"{where}: expected an array, got {type(got)}"
    assert got.shape == expected.shape, f"{where}: shape {got.shape}, want {expected.shape}"
    if expected.dtype == object:
        np.testing.assert_array_equal(got, expected, err_msg=where)
        return
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype}, want {expected.dtype}"
    if expected.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4...): compare in float32
        if expected.dtype.name == "bfloat16":
            rtol = max(rtol, BFLOAT16_RTOL)
        got, expected = got.astype(np.float32), expected.astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=where)


def check_binary(
    inputs: Sequence[Any], expected: Sequence[Any], got: Sequence[Any], where: str
) -> None:
    """Bernoulli draws: the expected shape and dtype, every value 0 or 1."""
    for index, (want, value) in enumerate(zip(expected, got, strict=True)):
        assert value.shape == want.shape and value.dtype == want.dtype, where
        assert np.isin(value, [0, 1]).all(), f"{where}[{index}]: values other than 0 and 1"


def check_dropout(
    inputs: Sequence[Any], expected: Sequence[Any], got: Sequence[Any], where: str
) -> None:
    """Training-mode Dropout: each element dropped (0) or kept and scaled by 1/(1-ratio),
    consistently with the returned mask."""
    x = inputs[0]
    ratio = float(inputs[1]) if len(inputs) > 1 else 0.5
    for want, value in zip(expected, got, strict=True):
        assert value.shape == want.shape and value.dtype == want.dtype, where
    kept = got[1] if len(got) > 1 else got[0] != 0
    scaled = x * x.dtype.type(1 / (1 - ratio))
    np.testing.assert_allclose(got[0], np.where(kept, scaled, 0), rtol=1e-6, err_msg=where)
    if 0 < ratio < 1 and x.size >= 20:  # one draw per element: not all kept, not all dropped
        assert 0 < np.count_nonzero(kept) < x.size, f"{where}: mask is all one value"


Check = Callable[[Sequence[Any], Sequence[Any], Sequence[Any], str], None]

NONDETERMINISTIC: dict[str, Check] = {
    "test_bernoulli": check_binary,
    "test_training_dropout": check_dropout,
}
"""Name prefix of nondeterministic cases -> the check that replaces the value match."""

RANDOM_OPS = frozenset(
    {
        "Bernoulli",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
    }
)


def nondeterministic_check(name: str) -> Check | None:
    return next((c for prefix, c in NONDETERMINISTIC.items() if name.startswith(prefix)), None)


def run_node_case(case: TestCase) -> None:
    """Prepare ``case``'s model and check every data set."""
    assert case.model is not None and case.data_sets is not None
    rep = backend.prepare(case.model, "CPU")
    check = nondeterministic_check(case.name)
    for inputs, outputs in case.data_sets:
        inputs = [as_value(x) for x in inputs]
        expected = [as_value(x) for x in outputs]
        got = list(rep.run(inputs))
        assert len(got) == len(expected), f"{len(got)} outputs, want {len(expected)}"
        if check is not None:
            check(inputs, expected, got, case.name)
            continue
        for index, (want, value) in enumerate(zip(expected, got)):
            if case.name in TIED_OUTPUTS:
                check_tied_softmax(value, want)
                continue
            assert_similar(want, value, case.rtol, case.atol, f"output {index}")


def expect(name: str, reason: str | None, run: Callable[[], None], listing: str) -> None:
    """Run a case: it must pass unless ``reason`` lists it, then it must fail."""
    if reason is None:
        run()
        return
    try:
        run()
    except Exception as exc:  # any failure is the expected one; the reason says which
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        pytest.xfail(f"{reason} ({type(exc).__name__}: {detail[:200]})")
    pytest.fail(f"{name} is listed as failing ({reason!r}) but passes; remove it from {listing}")


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_node_case(case: TestCase) -> None:
    expect(
        case.name,
        EXPECTED_FAILURES.get(case.name),
        lambda: run_node_case(case),
        "tests/conformance_expected_failures.py",
    )


def test_expected_failures_name_real_cases() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    assert sorted(set(EXPECTED_FAILURES) - set(names)) == []
    assert all(reason.strip() and "\n" not in reason for reason in EXPECTED_FAILURES.values())


def _op_types(graph: onnx.GraphProto) -> set[str]:
    found = set()
    for node in graph.node:
        found.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found |= _op_types(attr.g)
    return found


def _training_dropout(graph: onnx.GraphProto) -> bool:
    return any(n.op_type == "Dropout" and len(n.input) > 2 and n.input[2] for n in graph.node)


def test_nondeterministic_cases_are_known() -> None:
    """Every case that draws random numbers has a check other than value equality."""
    random_cases = {
        case.name
        for case in CASES
        if _op_types(case.model.graph) & RANDOM_OPS or _training_dropout(case.model.graph)
    }
    assert random_cases
    assert sorted(n for n in random_cases if nondeterministic_check(n) is None) == []


# -- the model sets under onnx/backend/test/data, through the backend ---------------------


def run_model_case(case: ModelCase) -> None:
    """Like ``test_models.run_case``, through ``backend.prepare`` and inputs by position."""
    proto = onnx.load(case.model_path)
    rep = backend.prepare(proto, "CPU")
    for inputs, expected in data_sets(case, proto):
        got = list(rep.run(list(inputs.values())))
        assert len(got) == len(expected)
        for index, (want, value) in enumerate(zip(expected, got)):
            if case.name in TIED_OUTPUTS:
                check_tied_softmax(value, want)
                continue
            assert_similar(want, value, case.rtol, case.atol, f"output {index}")


@pytest.mark.parametrize("case", MODEL_CASES, ids=str)
def test_model_case(case: ModelCase) -> None:
    expect(
        case.name,
        MODEL_EXPECTED_FAILURES.get(case.name),
        lambda: run_model_case(case),
        "tests/model_expectations.py",
    )
