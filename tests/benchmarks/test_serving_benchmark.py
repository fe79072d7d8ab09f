"""benchmarks/serving.py: the servers, tritonclient as the client, the table of medians.

A smoke run on a few clients: it checks that every server answers tritonclient (the
benchmark itself checks each server's answer against onnxruntime) and that the report has
its lines; speed is measured by the benchmark, never asserted here.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from benchmarks import models, serving


def test_a_small_run_reports_every_server_and_the_ratios(capsys: pytest.CaptureFixture[str]):
    options = ["--clients", "3", "--requests", "4", "--rounds", "1", "--client-processes", "2"]
    serving.main([*options, "--only", "abc"])
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    cpu = r"CPU per request: server [\d.]+ ms, worker [\d.]+ ms, clients [\d.]+ ms"
    for kind in ("(a)", "(b)", "(c)"):
        line = rf"round 1 {re.escape(kind)} .* req/s .*\(12 requests; {cpu}; load average [\d.]+\)"
        assert re.search(line, out), out
        assert re.search(rf"  {re.escape(kind)} .* req/s .* {cpu}\n", out), out
    assert "(a)/(c) throughput:" in out and "median" in out
    assert "(a)/(b) throughput:" in out
    assert "3 tritonclient http.aio clients in 2 process(es)" in out


def test_clients_in_one_process_or_several_send_every_request(tmp_path: Path):
    """Split among processes (3 clients in 2) or in this one, every client's timed
    requests are counted, and the clients' CPU time is measured."""
    model = tmp_path / serving.MODEL / "1" / "model.onnx"
    model.parent.mkdir(parents=True)
    onnx.save(models.mlp(serving.WIDTH, 4), model)
    port = serving.free_port()
    command = [sys.executable, "-m", "benchmarks.serving", "--serve", "c", str(tmp_path)]
    server = subprocess.Popen([*command, str(port)])
    try:
        serving.wait_ready(port)
        x = np.ones((1, serving.WIDTH), np.float32)
        for processes in (1, 2):
            latencies, elapsed, cpu = serving.load_in_processes(port, x, 3, 4, 30, processes)
            assert len(latencies) == 12 and all(latency > 0 for latency in latencies)
            assert 0 < max(latencies) <= elapsed and cpu > 0
    finally:
        server.terminate()
        server.wait(60)


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


def test_cpu_times_count_the_server_and_its_worker_apart():
    """A parent that computes for a while and a child that computes for longer: each
    one's CPU time lands on its own side."""
    burn = "import time\nend = time.process_time() + {}\nwhile time.process_time() < end: pass\n"
    script = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {burn.format(0.6)!r}])\n"
        + burn.format(0.2)
        + "child.wait()\nsys.stdin.read()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        cpu = serving.CpuTimes(process.pid)
        cpu.start()
        while not cpu.server.children() and process.poll() is None:
            time.sleep(0.01)
        worker = 0.0
        while cpu.server.children() and process.poll() is None:
            cpu.stop()  # while the child lives: a child that ended is no longer counted
            # (the child may end between the check and the reading: keep the most seen)
            worker = max(worker, cpu.spent[1])
            time.sleep(0.05)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(60)
    server = cpu.spent[0]
    assert 0.1 < server < 0.5 and worker > 0.3, (server, worker)
