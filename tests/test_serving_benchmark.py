"""benchmarks/serving.py: three servers, the timed phase, the table of medians and ratios.

A smoke run on a few clients: it checks that every server answers (the benchmark itself
checks each server's answer against onnxruntime) and that the report has its lines;
speed is measured by the benchmark, never asserted here.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from benchmarks import serving


def test_a_small_run_reports_every_server_and_the_ratios(capsys: pytest.CaptureFixture[str]):
    serving.main(["--clients", "3", "--requests", "4", "--rounds", "1"])
    out = capsys.readouterr().out
    for kind in ("(a)", "(b)", "(c)"):
        assert re.search(rf"round 1 {re.escape(kind)} .* req/s .*\(12 requests\)", out), out
    assert "(a)/(c) throughput:" in out and "median" in out
    assert "(a)/(b) throughput:" in out


def test_the_phase_starts_when_every_client_has_warmed_up():
    phase = serving.Phase(clients=2, seconds=30)
    sent: list[str] = []

    class Probe:
        def __init__(self, name: str) -> None:
            self.name = name

        def send(self) -> None:
            sent.append(self.name)

    phase.warmed_up(Probe("first"))  # type: ignore[arg-type]
    assert sent == [] and phase.deadline == float("inf")  # the clock has not started
    before = time.perf_counter()
    phase.warmed_up(Probe("second"))  # type: ignore[arg-type]
    assert sent == ["first", "second"]
    assert before <= phase.started <= time.perf_counter()
    assert phase.deadline == pytest.approx(phase.started + 30)


def test_a_client_counts_only_its_timed_answers():
    async def scenario() -> tuple[list[float], list[bytes]]:
        phase = serving.Phase(clients=1, seconds=30)
        latencies: list[float] = []
        client = serving.Client(b"request", 2, phase, latencies)
        written: list[bytes] = []

        class Transport:
            def write(self, data: bytes) -> None:
                written.append(data)

            def close(self) -> None:
                pass

        client.connection_made(Transport())  # type: ignore[arg-type]
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        for _ in range(serving.Client.WARM_UP + 2):
            client.data_received(answer[:20])  # in two parts
            client.data_received(answer[20:])
        await client.done
        return latencies, written

    latencies, written = asyncio.run(scenario())
    assert len(latencies) == 2  # the warm-up answers are not timed
    assert len(written) == serving.Client.WARM_UP + 2
