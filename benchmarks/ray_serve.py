"""What Ray Serve's path costs a request: ``aioinfer serve`` against the same repository
on Ray Serve with one replica, under the same client load.

    python -m benchmarks.ray_serve [--width 256] [--layers 2] [--clients 1 16]
                                   [--requests 400] [--rounds 3] [--seconds 20]

Both servers run at once, each in its own process tree, from one repository: one model,
an MLP of ``benchmarks/models.py`` (``layers`` x Gemm ``width`` x ``width`` + Relu,
float32; by default small, so that the compute is a small part of a request and the
serving path shows),
batched by the BATCH device (up to 16 rows, 1 ms). ``aioinfer serve REPO`` answers on
one port; ``aioinfer serve REPO --ray --replicas 1`` on another, through Ray's HTTP
proxy, the ingress replica and the model replica (three processes and two Ray calls per
request). Ray's processes stay up while ``aioinfer serve`` is measured, so both see the
same background. A third server is the baseline of Ray's own cost: Ray Serve alone, its
proxy in front of one replica of an ASGI app that answers ``{}`` to everything (on a
Ray instance of its own).

For each client count, the servers take turns for ``--rounds`` rounds (a change of load
on a shared machine hits both alike), with the clients of ``benchmarks/serving_bare.py``: one
HTTP/1.1 connection each, 5 untimed requests, then ``--requests`` timed ones back to
back; single-row binary requests. Reported: the medians over the rounds of throughput
and of the latency percentiles, and the median latency Ray adds per request. Only
127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks import models
from benchmarks.serving_bare import free_port, load, one, request_bytes, run, wait_ready

SERVERS = {
    "serve": "aioinfer serve",
    "ray": "aioinfer serve --ray (1 replica)",
    "echo": "Ray Serve alone (constant answer)",
}


class EchoApp:
    """An ASGI app that reads the request and answers ``{}``: Ray Serve's own path (its
    proxy and one replica) with nothing of aioinfer's, for the baseline."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


def serve_echo(port: int) -> None:
    """Run :class:`EchoApp` on a local Ray instance until SIGTERM, with the ingress
    options of :mod:`aioinfer.ray`."""
    import signal
    import threading

    import ray
    from ray import serve

    from aioinfer.ray import INGRESS_DEFAULTS

    ray.init(address="local", include_dashboard=False)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deployment = serve.deployment(name="echo", **INGRESS_DEFAULTS)(
        serve.ingress(EchoApp())(type("Echo", (), {}))
    )
    serve.run(deployment.bind(), name="echo", route_prefix="/")
    stop.wait()
    serve.shutdown()
    ray.shutdown()


def machine() -> str:
    """The CPU, its cores, and the versions that matter here."""
    import ray

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} logical cores; Python {platform.python_version()}, "
        f"Ray {ray.__version__}, {platform.system()} {platform.release()}"
    )


def start(kind: str, repository: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "aioinfer.cli", "serve", str(repository)]
    command += ["--port", str(port)]
    if kind == "ray":
        command += ["--ray", "--replicas", "1"]
    elif kind == "echo":
        command = [sys.executable, "-m", "benchmarks.ray_serve", "--serve-echo", str(port)]
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=400, help="timed requests per client")
    parser.add_argument("--seconds", type=float, default=20, help="time limit of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, args.width)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        repository = Path(tmp)
        (repository / "mlp" / "1").mkdir(parents=True)
        model = repository / "mlp" / "1" / "model.onnx"
        onnx.save(models.mlp(args.width, args.layers), model)
        config = {"batching": {"max_batch_size": 16, "timeout_ms": 1}}
        (repository / "mlp" / "config.json").write_text(json.dumps(config))
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"x": x})[0]
        del session
        ports = {kind: free_port() for kind in SERVERS}
        servers = [start(kind, repository, port) for kind, port in ports.items()]
        try:
            for port in ports.values():
                wait_ready(port, "/v2/health/ready", timeout=300)
            payloads = {kind: request_bytes("a", port, x) for kind, port in ports.items()}
            for kind, port in ports.items():
                if kind == "echo":
                    continue
                answer = run(one(port, payloads[kind]))
                y = np.frombuffer(answer[-expected.nbytes :], np.float32).reshape(expected.shape)
                np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
            print(f"machine: {machine()}")
            print(
                f"MLP {args.layers}x{args.width}, BATCH (16 rows, 1 ms); single-row binary "
                f"requests, loopback HTTP/1.1; medians of {args.rounds} interleaved rounds"
            )
            for clients in args.clients:
                figures: dict[str, list[tuple[float, float, float]]] = {k: [] for k in SERVERS}
                for _ in range(args.rounds):
                    for kind, port in ports.items():
                        latencies, elapsed = run(
                            load(port, payloads[kind], clients, args.requests, args.seconds)
                        )
                        p50, p99 = np.percentile(latencies, [50, 99]) * 1e3
                        figures[kind].append((len(latencies) / elapsed, p50, p99))
                print(f"{clients} client(s):")
                medians = {}
                for kind, rows in figures.items():
                    rate, p50, p99 = (float(np.median([r[i] for r in rows])) for i in range(3))
                    medians[kind] = (rate, p50)
                    print(
                        f"  {SERVERS[kind]:34s} {rate:8.0f} req/s   p50 {p50:7.2f} ms   "
                        f"p99 {p99:7.2f} ms"
                    )
                added = medians["ray"][1] - medians["serve"][1]
                ratio = medians["ray"][0] / medians["serve"][0]
                print(f"  Ray adds {added:.2f} ms at the median; throughput x{ratio:.2f}")
                proxy = medians["echo"][1]
                print(f"  of which Ray's proxy and one replica alone: {proxy:.2f} ms")
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(120)


if __name__ == "__main__":
    main()
