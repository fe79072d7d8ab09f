"""Count ONNX's node conformance cases that other runtimes pass, with the comparison and
nondeterminism checks of tests/test_conformance.py (for docs/conformance.md).

    python scripts/conformance_baselines.py      # onnx reference evaluator, onnxruntime
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnxruntime.backend
from onnx.reference import ReferenceEvaluator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The repository root is on the path now.
from tests.test_conformance import (
    CASES,
    as_value,
    assert_similar,
    nondeterministic_check,
)

Runner = Callable[[onnx.ModelProto], Callable[[Sequence[Any]], Sequence[Any]]]


def reference(model: onnx.ModelProto) -> Callable[[Sequence[Any]], Sequence[Any]]:
    evaluator = ReferenceEvaluator(model)
    names = [i.name for i in model.graph.input]
    return lambda inputs: evaluator.run(None, dict(zip(names, inputs)))


def onnxruntime_backend(model: onnx.ModelProto) -> Callable[[Sequence[Any]], Sequence[Any]]:
    return onnxruntime.backend.prepare(model, "CPU").run


def passes(run_of: Runner, case: Any) -> bool:
    try:
        run = run_of(case.model)
        for inputs, outputs in case.data_sets:
            inputs = [as_value(x) for x in inputs]
            expected = [as_value(x) for x in outputs]
            got = list(run(inputs))
            check = nondeterministic_check(case.name)
            if check is not None:
                check(inputs, expected, got, case.name)
                continue
            assert len(got) == len(expected)
            for index, (want, value) in enumerate(zip(expected, got)):
                assert_similar(want, value, case.rtol, case.atol, f"output {index}")
    except Exception:  # any failure counts as not passing
        return False
    return True


def main() -> int:
    for name, run_of in (("onnx reference", reference), ("onnxruntime", onnxruntime_backend)):
        passed = sum(passes(run_of, case) for case in CASES)
        print(f"{name}: {passed} / {len(CASES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
