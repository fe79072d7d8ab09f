"""benchmarks/compare.py: one command, three runtimes, a table with ratios."""

from __future__ import annotations

import time

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


def test_the_device_is_chosen_and_named(capsys: pytest.CaptureFixture[str]) -> None:
    args = "--models lstm --blocks 1 --runs 1 --warmup 0 --reference-budget 0 --no-memory"
    compare.main([*args.split(), "--device", "ORT"])
    out = capsys.readouterr().out
    assert out.startswith("Machine: ") and "; aioinfer on ORT" in out.splitlines()[0]


def test_memory_probe_reports_growth() -> None:
    peak = compare.memory_probe("aioinfer", "lstm")
    # VmHWM minus the RSS noted before: pages the allocator returned between the two
    # readings can make a model this small read a hair below zero.
    assert -1 < peak < 200


def test_a_block_warms_for_the_count_and_the_least_time() -> None:
    """onnxruntime's spinning threads tax what runs right after it for tens of
    milliseconds: each block's warm-up lasts WARMUP_SECONDS, however fast the model."""
    calls: list[int] = []
    started = time.perf_counter()
    done = compare.warm(lambda: calls.append(1), 3, seconds=0.05)
    assert done == len(calls) > 3 and time.perf_counter() - started >= 0.05
    assert compare.warm(lambda: None, 2, seconds=0) == 2  # the count alone
    assert compare.WARMUP_SECONDS >= 0.1
