"""benchmarks/serving.py: the servers, tritonclient as the client, the table of medians.

A smoke run on a few clients: it checks that every server answers tritonclient (the
benchmark itself checks each server's answer against onnxruntime) and that the report has
its lines; speed is measured by the benchmark, never asserted here.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from benchmarks import serving


def test_a_small_run_reports_every_server_and_the_ratios(capsys: pytest.CaptureFixture[str]):
    serving.main(["--clients", "3", "--requests", "4", "--rounds", "1", "--only", "abc"])
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    for kind in ("(a)", "(b)", "(c)"):
        assert re.search(rf"round 1 {re.escape(kind)} .* req/s .*\(12 requests\)", out), out
    assert "(a)/(c) throughput:" in out and "median" in out
    assert "(a)/(b) throughput:" in out


def test_the_phase_starts_when_every_client_has_warmed_up():
    async def scenario() -> tuple[list[str], serving.Phase]:
        phase = serving.Phase(clients=2, seconds=30)
        started: list[str] = []

        async def client(name: str) -> None:
            await phase.warmed_up()
            started.append(name)

        first = asyncio.create_task(client("first"))
        await asyncio.sleep(0.01)
        assert started == [] and phase.deadline == float("inf")  # the clock has not started
        await client("second")
        await first
        return started, phase

    started, phase = asyncio.run(scenario())
    assert sorted(started) == ["first", "second"]
    assert phase.deadline == pytest.approx(phase.started + 30)
