"""A live server on loopback (uvicorn in a thread, a random free port) and test models."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import uvicorn
from starlette.types import ASGIApp

from aioinfer.serving import create_app
from aioinfer.serving.connection import ConnectionLimits
from tests import helpers
from tests.helpers import make_model, mlp_model, tensor_info, two_input_model

WIDE = 256
EVERY_VERSION = {"version_policy": {"all": {}}}
"""The config key that serves every version of a model (the default serves the latest)."""


class LiveServer:
    """``app`` served by uvicorn on 127.0.0.1 at a free port, in a background thread,
    with the connections of ``serve`` (``ConnectionLimits``' protocol, which answers
    infer requests itself: ``serving/rest/uvicorn_http.py``); ``options`` go to ``uvicorn.Config``
    (limits, TLS, another ``http`` protocol)."""

    def __init__(self, app: ASGIApp, graceful_timeout: int = 10, **options: Any) -> None:
        self.app = app
        options = {**ConnectionLimits().uvicorn_options(), **options}
        # IPPROTO_TCP, as uvicorn's own sockets: asyncio sets TCP_NODELAY on the
        # connections of a TCP socket only, and without it a response written in two
        # parts waits for the client's delayed ACK (~40 ms per request).
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", timeout_graceful_shutdown=graceful_timeout, **options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Graceful shutdown: stop accepting, drain, run the lifespan's shutdown."""
        self.server.should_exit = True

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.thread.join(60)
        self.socket.close()


def chain_model(steps: int) -> onnx.ModelProto:
    """(MatMul, Tanh) * steps over ``["n", WIDE]``: slow enough to stop half-way."""
    return helpers.chain_model(steps, WIDE, seed=1)


def accumulator_model() -> onnx.ModelProto:
    """``total = state + x`` with ``state`` paired to ``total`` (STATEFUL): a running sum."""
    nodes = [
        oh.make_node("Add", ["state", "x"], ["state_out"]),
        oh.make_node("Identity", ["state_out"], ["total"]),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, [1, 2]), tensor_info("state", np.float32, [1, 2])],
        [tensor_info("total", np.float32, [1, 2]), tensor_info("state_out", np.float32, [1, 2])],
        name="accumulator",
    )


def write_model(repo: Path, name: str, version: int, model: onnx.ModelProto) -> None:
    path = repo / name / str(version)
    path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path / "model.onnx")


def write_config(repo: Path, name: str, config: dict[str, Any]) -> None:
    (repo / name / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="package")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp (versions 1 and 2, both served, batched), plain (three inputs, not batchable), slow (one
    inference at a time, one waiting), accumulator (stateful, for sequences)."""
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "mlp", 1, mlp_model(seed=0))
    write_model(repo, "mlp", 2, mlp_model(seed=1))
    write_config(
        repo, "mlp", {"batching": {"max_batch_size": 8, "timeout_ms": 20}, **EVERY_VERSION}
    )
    write_model(repo, "plain", 1, two_input_model())
    write_model(repo, "slow", 1, chain_model(300))
    write_config(repo, "slow", {"max_concurrency": 1, "max_queue": 1})
    write_model(repo, "accumulator", 1, accumulator_model())
    write_config(
        repo, "accumulator", {"stateful": {"state": "state_out"}, "sequence_idle_timeout_s": 1}
    )
    return repo


@pytest.fixture(scope="package")
def server(repository: Path) -> Iterator[LiveServer]:
    with LiveServer(create_app(repository)) as live:
        yield live
