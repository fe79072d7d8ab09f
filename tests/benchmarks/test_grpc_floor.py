"""benchmarks/grpc_floor.py: grpcio's and HTTP's floors next to aioinfer's gRPC and REST
paths.

A smoke run on a few clients: every server answers (the clients check each answer's
outputs against onnxruntime's), and the report has a row per server with the server's
and the clients' CPU per request; speed is measured by the benchmark, never asserted
here.
"""

from __future__ import annotations

import re

import pytest

from benchmarks import grpc_floor


@pytest.mark.parametrize("client", [[], ["--tritonclient"]], ids=["bare", "tritonclient"])
def test_a_small_run_reports_every_server(capsys: pytest.CaptureFixture[str], client: list[str]):
    grpc_floor.main(["--clients", "2", "--requests", "3", "--rounds", "1", *client])
    out = capsys.readouterr().out
    assert out.startswith("machine: ")
    assert ("tritonclient clients" if client else "bare clients") in out
    for kind in ("floor", "rest-floor", "grpc", "rest"):
        cpu = r"CPU per request: server [\d.]+ ms, clients [\d.]+ ms, both [\d.]+ ms"
        row = rf"round 1 {kind} +[\d.]+ req/s +{cpu}"
        assert re.search(row, out), out
        assert re.search(rf"\n  {kind} +[\d.]+ req/s", out), out
