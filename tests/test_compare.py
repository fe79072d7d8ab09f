"""benchmarks/compare.py: one command, three runtimes, a table with ratios."""

from __future__ import annotations

import pytest

from benchmarks import compare


def test_measure_and_table() -> None:
    row = compare.measure("lstm", blocks=1, runs=2, warmup=1, budget=1.0)
    assert row.aioinfer_ms > 0 and row.onnxruntime_ms > 0
    assert row.reference_ms is not None and 1 <= row.reference_runs <= 3
    assert row.max_abs_diff < 1e-4  # aioinfer and onnxruntime agree
    row.aioinfer_mb, row.onnxruntime_mb = 2.0, 4.0
    text = compare.table([row], budget=1.0)
    ratio = f"{row.aioinfer_ms / row.onnxruntime_ms:.2f}"
    assert f"| {ratio} |" in text and "| 0.50 |" in text  # latency and memory ratios
    assert f"({row.reference_runs}x)" in text
    assert "**geometric mean**" in text


def test_command_prints_machine_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = "--models lstm --blocks 1 --runs 1 --warmup 0 --reference-budget 0 --no-memory"
    compare.main(args.split())
    out = capsys.readouterr().out
    assert out.startswith("Machine: ")
    assert "| 2-layer LSTM" in out and "| skipped |" in out


def test_memory_probe_reports_growth() -> None:
    peak = compare.memory_probe("aioinfer", "lstm")
    # VmHWM minus the RSS noted before: pages the allocator returned between the two
    # readings can make a model this small read a hair below zero.
    assert -1 < peak < 200
