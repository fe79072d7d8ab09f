"""docs/operators.md is generated from the kernel registry and must be current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_operators_doc_is_current():
    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_operators_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.render()
    assert "| ai.onnx | Conv |" in text
    assert (ROOT / "docs" / "operators.md").read_text() == text, (
        "docs/operators.md is out of date: run python scripts/gen_operators_doc.py"
    )
