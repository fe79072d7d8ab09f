"""The transports' own cost per request, against aioinfer's gRPC and REST paths.

    python -m benchmarks.grpc_floor [--clients 64] [--requests 300] [--rounds 3] [--tritonclient]

Four servers take turns, each in its own process, under 64 clients (one connection
each, on uvloop in this process; bare ones, or tritonclient's asyncio clients with
``--tritonclient``) sending single rows of the MLP of ``benchmarks/models.py``:

(floor) a ``grpc.aio`` server on uvloop, as ``aioinfer serve`` runs it, whose only method
    (``ModelInfer``, a generic handler on raw bytes) returns a response prepared ahead,
    holding the right outputs: what grpcio costs per request before any work is done;
(rest-floor) the same for HTTP/1.1: an asyncio protocol on uvloop that parses requests
    with httptools (the parser uvicorn uses) and answers each with a response prepared
    ahead (the binary tensor extension, as aioinfer answers): what any Python HTTP server
    costs at the least;
(grpc) ``aioinfer serve --grpc-port`` with the server's defaults (no ``config.json``),
    asked over gRPC;
(rest) the same server asked over REST (HTTP/1.1, the binary tensor extension).

For each: requests per second, the server process's CPU time per request (user and
system, all its threads, over the whole load: the 5 untimed requests of each client
included) and the clients' (this process's, over the same load). On two cores shared by
server and clients, a transport whose floor (server and clients) costs more per request
than another's whole request, compute included, cannot serve more requests a second;
docs/grpc.md and docs/serving.md give the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import onnx

from benchmarks import models
from benchmarks.serving import CpuTimes
from benchmarks.serving_bare import WIDTH, free_port, run, transport_load, wait_ready

SERVICE = "inference.GRPCInferenceService"


def serve_floor(port: int, answer: bytes) -> None:
    """The floor server: ``ModelInfer`` answers ``answer`` whatever it is asked."""

    import grpc

    async def infer(request: bytes, context: object) -> bytes:
        return answer

    async def main() -> None:
        handler = grpc.unary_unary_rpc_method_handler(infer)
        server = grpc.aio.server(
            handlers=(grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    run(main())  # on uvloop, as aioinfer serve runs


def serve_rest_floor(port: int, answer: bytes) -> None:
    """The HTTP floor server: every request, whatever it asks, gets ``answer`` (a whole
    HTTP/1.1 response) once httptools has parsed all of it."""
    import asyncio

    import httptools

    class Floor(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)
            self.parser = httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_complete(self) -> None:
            self.transport.write(answer)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Floor, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    run(main())  # on uvloop, as aioinfer serve runs


def prepared_http_answer(expected: np.ndarray) -> bytes:
    """A whole HTTP/1.1 response holding ``expected`` as output ``y`` in the binary tensor
    extension, with the headers aioinfer sends."""
    data = expected.astype(np.float32).tobytes()
    header = json.dumps(
        {
            "model_name": "mlp",
            "model_version": "1",
            "outputs": [
                {
                    "name": "y",
                    "datatype": "FP32",
                    "shape": list(expected.shape),
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
        },
        separators=(",", ":"),
    ).encode()
    head = (
        "HTTP/1.1 200 OK\r\n"
        "date: Tue, 01 Dec 2026 00:00:00 GMT\r\n"
        "server: uvicorn\r\n"
        "content-type: application/octet-stream\r\n"
        f"inference-header-content-length: {len(header)}\r\n"
        f"content-length: {len(header) + len(data)}\r\n\r\n"
    )
    return head.encode() + header + data


def prepared_answer(expected: np.ndarray) -> bytes:
    """A ``ModelInferResponse`` holding ``expected`` as output ``y``."""
    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelInferResponse(model_name="mlp", model_version="1")
    response.outputs.add(name="y", datatype="FP32", shape=expected.shape)
    response.raw_output_contents.append(expected.astype(np.float32).tobytes())
    return bytes(response.SerializeToString())


def wait_grpc(port: int, timeout: float = 120) -> None:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    finally:
        channel.close()


def measure(
    kind: str, server: subprocess.Popen[bytes], port: int, x: np.ndarray, expected: np.ndarray
) -> tuple[float, float, float]:
    """Requests/s, and the server's and the clients' CPU (ms) per request, of one load of
    ``kind``."""
    cpu = CpuTimes(server.pid)
    cpu.start()
    clients = time.process_time()
    latencies, elapsed = run(
        transport_load(kind, port, x, expected, ARGS.clients, ARGS.requests, ARGS.seconds)
    )
    clients = time.process_time() - clients
    cpu.stop()
    count = len(latencies) + 5 * ARGS.clients
    return len(latencies) / elapsed, cpu.spent[0] / count * 1e3, clients / count * 1e3


ARGS = argparse.Namespace(clients=64, requests=300, seconds=20.0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--tritonclient", action="store_true", help="tritonclient's asyncio clients, not bare"
    )
    parser.add_argument("--floor-server", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_server:
        transport, port, answer = args.floor_server
        serve = serve_floor if transport == "grpc" else serve_rest_floor
        serve(int(port), Path(answer).read_bytes())
        return
    ARGS.clients, ARGS.requests, ARGS.seconds = args.clients, args.requests, args.seconds
    import onnxruntime as ort

    from benchmarks.compare import machine

    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "repo" / "mlp" / "1" / "model.onnx"
        model.parent.mkdir(parents=True)
        onnx.save(models.mlp(WIDTH, 4), model)
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"x": x})[0]
        answers = {"floor": Path(tmp) / "grpc.bin", "rest-floor": Path(tmp) / "http.bin"}
        answers["floor"].write_bytes(prepared_answer(expected))
        answers["rest-floor"].write_bytes(prepared_http_answer(expected))
        print(f"machine: {machine()}")
        clients = "tritonclient" if args.tritonclient else "bare"
        print(f"MLP 4x{WIDTH}, {args.clients} {clients} clients x {args.requests} single rows")
        results: dict[str, list[tuple[float, float, float]]] = {
            "floor": [],
            "rest-floor": [],
            "grpc": [],
            "rest": [],
        }
        for round_ in range(1, args.rounds + 1):
            for kind in results:
                port, grpc_port = free_port(), free_port()
                if kind in answers:
                    transport = "grpc" if kind == "floor" else "rest"
                    command = [sys.executable, "-m", "benchmarks.grpc_floor", "--floor-server"]
                    command += [transport, str(grpc_port), str(answers[kind])]
                else:
                    command = [sys.executable, "-m", "aioinfer.cli", "serve", str(model.parents[2])]
                    command += ["--port", str(port), "--grpc-port", str(grpc_port)]
                server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
                try:
                    if kind == "floor":
                        wait_grpc(grpc_port)
                    elif kind == "rest-floor":
                        wait_ready(grpc_port, "/")
                    else:
                        wait_ready(port, "/v2/health/ready")
                    load = "rest" if kind.startswith("rest") else "grpc"
                    load += "" if args.tritonclient else "-bare"
                    target = port if kind == "rest" else grpc_port
                    measured = measure(load, server, target, x, expected)
                finally:
                    server.terminate()
                    server.wait(60)
                results[kind].append(measured)
                print(f"  round {round_} {_row(kind, *measured)}", flush=True)
                time.sleep(0.5)
    print(f"medians of {args.rounds} rounds:")
    for kind, values in results.items():
        rate, server_ms, clients_ms = (float(np.median([v[i] for v in values])) for i in range(3))
        print(f"  {_row(kind, rate, server_ms, clients_ms)}")


def _row(kind: str, rate: float, server_ms: float, clients_ms: float) -> str:
    return (
        f"{kind:10s} {rate:8.0f} req/s   CPU per request: server {server_ms:.3f} ms, "
        f"clients {clients_ms:.3f} ms, both {server_ms + clients_ms:.3f} ms"
    )


if __name__ == "__main__":
    main()
