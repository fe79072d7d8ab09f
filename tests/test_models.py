"""The real models shipped with the onnx package, run end to end on the CPU device.

Sets: ``onnx/backend/test/data/{light,pytorch-converted,pytorch-operator,simple}``.
A directory case holds ``model.onnx`` and ``test_data_set_*/{input,output}_*.pb``; its
inputs are fed through the synchronous path and its outputs compared with the shipped
ones (rtol 1e-3, atol 1e-5). A ``light/light_<name>.onnx`` model has no inputs: they are
generated exactly as onnx's backend runner does, and the output is compared with
``light_<name>_output_0.pb`` (the runner's tolerances: rtol 1e-3, atol 1e-7; densenet121
rtol 2e-3). Cases in ``model_expectations.EXPECTED_FAILURES`` must still fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.runner import Runner

import aioinfer
from tests.model_expectations import EXPECTED_FAILURES, TIED_OUTPUTS, check_tied_softmax

DATA_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data"
DATA_SET_KINDS = ("pytorch-converted", "pytorch-operator", "simple")

DATA_SET_RTOL = 1e-3
DATA_SET_ATOL = 1e-5
LIGHT_RTOL = {"light_densenet121": 2e-3}
"""The runner's per-model rtol (onnx/backend/test/data/real/*/data.json); default 1e-3."""
LIGHT_ATOL = 1e-7


@dataclass(frozen=True)
class ModelCase:
    """One model and the data it is checked against."""

    name: str
    model_path: Path
    rtol: float
    atol: float
    light: bool = False

    def __str__(self) -> str:
        return self.name


def discover_cases() -> list[ModelCase]:
    cases = [
        ModelCase(path.stem, path, LIGHT_RTOL.get(path.stem, 1e-3), LIGHT_ATOL, light=True)
        for path in sorted((DATA_DIR / "light").glob("light_*.onnx"))
    ]
    for kind in DATA_SET_KINDS:
        for model_path in sorted((DATA_DIR / kind).glob("*/model.onnx")):
            name = model_path.parent.name
            cases.append(ModelCase(name, model_path, DATA_SET_RTOL, DATA_SET_ATOL))
    return cases


CASES = discover_cases()


def load_value(path: Path, type_proto: onnx.TypeProto) -> Any:
    """A serialized input/output as the graph declares it (tensor, sequence, optional)."""
    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        sequence = onnx.SequenceProto()
        sequence.ParseFromString(data)
        return numpy_helper.to_list(sequence)
    if type_proto.HasField("optional_type"):
        optional = onnx.OptionalProto()
        optional.ParseFromString(data)
        return numpy_helper.to_optional(optional)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def data_sets(case: ModelCase, proto: onnx.ModelProto) -> list[tuple[dict[str, Any], list[Any]]]:
    """(inputs by name, expected outputs in order) for each data set of ``case``."""
    graph = proto.graph
    if case.light:
        initializers = {t.name for t in graph.initializer}
        inputs = {
            x.name: Runner.generate_dummy_data(x, seed=0, name=case.name, random=False)
            for x in graph.input
            if x.name not in initializers
        }
        prefix = case.model_path.with_suffix("")
        expected = [
            load_value(Path(f"{prefix}_output_{i}.pb"), out.type)
            for i, out in enumerate(graph.output)
        ]
        return [(inputs, expected)]
    sets = []
    for set_dir in sorted(case.model_path.parent.glob("test_data_set_*")):
        # Like the runner: input_i belongs to graph.input[i], output_i to graph.output[i].
        n_inputs = len(list(set_dir.glob("input_*.pb")))
        n_outputs = len(list(set_dir.glob("output_*.pb")))
        inputs = {
            graph.input[i].name: load_value(set_dir / f"input_{i}.pb", graph.input[i].type)
            for i in range(n_inputs)
        }
        expected = [
            load_value(set_dir / f"output_{i}.pb", graph.output[i].type) for i in range(n_outputs)
        ]
        sets.append((inputs, expected))
    assert sets, f"{case.model_path.parent} has no test_data_set_*"
    return sets


def run_case(core: aioinfer.Core, case: ModelCase) -> None:
    """Compile ``case``'s model and check every data set on a fresh request."""
    proto = onnx.load(case.model_path)
    compiled = core.compile_model(case.model_path, "CPU")
    for inputs, expected in data_sets(case, proto):
        results = compiled.create_infer_request().infer_sync(inputs)
        assert len(results) == len(expected)
        for port, want in zip(compiled.outputs, expected, strict=True):
            got = results[port.name]
            want = np.asarray(want)
            assert got.shape == want.shape, f"{port.name}: shape {got.shape}, want {want.shape}"
            assert got.dtype == want.dtype, f"{port.name}: dtype {got.dtype}, want {want.dtype}"
            if case.name in TIED_OUTPUTS:
                check_tied_softmax(got, want)
            elif want.dtype == object:
                np.testing.assert_array_equal(got, want, err_msg=port.name)
            else:
                np.testing.assert_allclose(
                    got, want, rtol=case.rtol, atol=case.atol, err_msg=port.name
                )


@pytest.mark.parametrize("case", CASES, ids=str)
def test_model(core: aioinfer.Core, case: ModelCase) -> None:
    reason = EXPECTED_FAILURES.get(case.name)
    if reason is None:
        run_case(core, case)
        return
    try:
        run_case(core, case)
    except Exception as exc:  # any failure is the expected one; the reason says which
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        pytest.xfail(f"{reason} ({type(exc).__name__}: {detail})")
    pytest.fail(
        f"{case.name} is listed in EXPECTED_FAILURES ({reason!r}) but now passes; "
        "remove it from tests/model_expectations.py"
    )


def test_expected_failures_name_real_cases() -> None:
    names = {case.name for case in CASES}
    assert sorted(set(EXPECTED_FAILURES) - names) == []
    assert len(CASES) == len(names)  # ids are unique across the sets
