"""Many models under one memory budget: 64 tritonclient clients over 8 models that hold
about 3x the budget together, with a skewed (Zipf-like) popularity.

    pip install --no-deps -r benchmarks/real-models-requirements.txt   # any venv
    python -m benchmarks.many_models [--site DIR] [--seconds 60] [--clients 64]
                                     [--ratio 3 | --budget 193MiB] [--zipf 1.0] [--generated]

The repository holds the 8 real models of :data:`MODELS` (from the wheels of
``benchmarks/real-models-requirements.txt``, found in the site-packages ``--site``, by
default this interpreter's), or with ``--generated`` (or when a wheel is missing) 8
generated MatMul models of 24-49 MiB of weights each. Every model is served with the
server's defaults (no ``config.json``).

1. **Calibration**: ``aioinfer serve --model-control-mode explicit`` with no model
   loaded gives the server's own resident memory; each model is then loaded and unloaded
   through the repository API, and the memory the manager accounts it at read from
   ``/metrics``. The budget is their total divided by ``--ratio``.
2. **The run**: ``aioinfer serve REPO --memory-budget B`` (the models that fit load at
   the start, the others on demand); ``--clients`` ``tritonclient.http.aio`` clients in
   this process, each choosing a model per request with probability proportional to
   ``1 / rank ** zipf`` (rank 1: the first of :data:`MODELS`), for ``--seconds``. A 503
   (a model's waiting queue full: documented as retryable) is counted and retried after
   50 ms; any other failure is counted as an error. The server's resident memory (its
   process and children) is sampled every 50 ms. ``--budget`` (e.g. ``193MiB``) sets
   the budget instead of the models' total over ``--ratio``, to compare trees at one
   budget.

Reported: requests/s, p50 and p99 latency (answered requests), 503s and errors, the loads,
evictions, hits, misses and load times of ``/metrics``, and the peak resident memory
against the server's own plus the budget, with what comes on top of the budget (what
the first load left once unloaded: the engine's libraries; the clients' requests of the
mean size, twice). Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import onnx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from aioinfer.serving.repository import parse_bytes
from benchmarks.real_models import CASES, Case

MODELS = (
    "magika",
    "orientation",
    "ppocr_rec",
    "ddddocr_rec",
    "ppocr_det",
    "table_slanet",
    "ddddocr_det",
    "layout_cdla",
)
"""The real models, most popular first (the light ones; the heavy image models last)."""

GENERATED_WIDTHS = (2560, 2816, 3072, 3200, 3328, 3456, 3584, 3584)
"""The widths of the generated models' square weights (24-49 MiB each)."""

Feeds = dict[str, np.ndarray]


def _distribution_file(case: Case, site: Path | None) -> Path | None:
    where: dict[str, Any] = {} if site is None else {"path": [str(site)]}
    for dist in importlib.metadata.distributions(name=case.package, **where):
        found = dist.locate_file(case.path)
        return Path(str(found)) if Path(str(found)).is_file() else None
    return None


def build_repository(root: Path, site: Path | None, generated: bool) -> dict[str, Feeds]:
    """The models under ``root`` (``<name>/1/model.onnx``); each one's request inputs."""
    feeds: dict[str, Feeds] = {}
    rng = np.random.default_rng(0)
    files = {} if generated else {name: _distribution_file(CASES[name], site) for name in MODELS}
    if files and all(files.values()):
        for name, path in files.items():
            assert path is not None
            (root / name / "1").mkdir(parents=True)
            shutil.copyfile(path, root / name / "1" / "model.onnx")
            feeds[name] = CASES[name].feeds(rng)
        return feeds
    missing = [name for name, path in files.items() if path is None]
    if missing and not generated:
        print(f"missing wheels for {missing}: generated models instead", file=sys.stderr)
    for index, width in enumerate(GENERATED_WIDTHS):
        name = f"matmul_{index}"
        weights = rng.standard_normal((width, width)).astype(np.float32)
        graph = onnx.helper.make_graph(
            [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])],
            name,
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", width])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", width])],
            [onnx.numpy_helper.from_array(weights, "w")],
        )
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, root / name / "1" / "model.onnx")
        feeds[name] = {"x": rng.standard_normal((1, width)).astype(np.float32)}
    return feeds


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def server(repo: Path, log: Path, *options: str) -> Iterator[tuple[str, psutil.Process]]:
    """``aioinfer serve repo`` on a free port of 127.0.0.1, until the block ends."""
    port = _free_port()
    command = [sys.executable, "-m", "aioinfer.cli", "serve", str(repo), "--port", str(port)]
    with log.open("a") as output:
        process = subprocess.Popen([*command, *options], stdout=output, stderr=output)
    url = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server ended: {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://{url}/v2/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not get ready")
            time.sleep(0.1)
        yield url, psutil.Process(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tree_memory(process: psutil.Process) -> int:
    """The resident memory of ``process`` and its children."""
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with suppress(psutil.Error):  # it ended meanwhile
            total += child.memory_info().rss
    return int(total)


def metrics(url: str) -> dict[str, dict[str, float]]:
    """``/metrics``'s model manager samples: name -> model -> value."""
    text = httpx.get(f"http://{url}/metrics", timeout=60).text
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("aioinfer_model_") or sample.name.startswith(
                "aioinfer_memory"
            ):
                model = sample.labels.get("model", "")
                if "le" in sample.labels:
                    continue
                found.setdefault(sample.name, {})[model] = float(sample.value)
    return found


def calibrate(repo: Path, log: Path, names: list[str]) -> tuple[int, int, dict[str, int]]:
    """The server's own resident memory, what the first load left behind once unloaded
    (an engine's libraries), and what the manager accounts each model at."""
    import tritonclient.http as httpclient

    options = ("--model-control-mode", "explicit", "--memory-budget", "1TiB")
    with server(repo, log, *options) as (url, process):
        time.sleep(1.0)
        own = tree_memory(process)
        client = httpclient.InferenceServerClient(url, network_timeout=600)
        sizes = {}
        left = 0
        for name in names:
            client.load_model(name)
            sizes[name] = int(metrics(url)["aioinfer_model_memory_bytes"][name])
            client.unload_model(name)
            left = left or tree_memory(process) - own
    return own, left, sizes


class Sampler(threading.Thread):
    """The resident memory of a process tree every ``interval`` seconds."""

    def __init__(self, process: psutil.Process, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.interval = interval
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append(tree_memory(self.process))
            except psutil.Error:
                return
            time.sleep(self.interval)


async def clients(
    url: str, feeds: dict[str, Feeds], count: int, seconds: float, zipf: float
) -> dict[str, Any]:
    """``count`` clients for ``seconds``: latencies, 503s, errors, per-model requests."""
    import tritonclient.http as httpclient
    import tritonclient.http.aio as aioclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    names = list(feeds)
    weights = [1.0 / (rank + 1) ** zipf for rank in range(len(names))]
    latencies: list[float] = []
    busy = errors = 0
    chosen = dict.fromkeys(names, 0)
    messages: list[str] = []

    def inputs(name: str) -> list[Any]:
        made = []
        for key, array in feeds[name].items():
            tensor = httpclient.InferInput(key, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            made.append(tensor)
        return made

    async def client(seed: int, deadline: float) -> None:
        nonlocal busy, errors
        rng = random.Random(seed)
        connection = aioclient.InferenceServerClient(url, conn_timeout=600)
        try:
            while time.perf_counter() < deadline:
                name = rng.choices(names, weights)[0]
                chosen[name] += 1
                started = time.perf_counter()
                try:
                    await connection.infer(name, inputs(name))
                except InferenceServerException as exc:
                    if exc.status() == "503":
                        busy += 1
                        await asyncio.sleep(0.05)
                        continue
                    errors += 1
                    messages.append(f"{name}: {exc}")
                    continue
                except aiohttp.ClientError as exc:  # the connection, not an answer
                    errors += 1
                    messages.append(f"{name}: {type(exc).__name__}: {exc}")
                    await connection.close()
                    connection = aioclient.InferenceServerClient(url, conn_timeout=600)
                    continue
                latencies.append(time.perf_counter() - started)
        finally:
            await connection.close()

    started = time.perf_counter()
    deadline = started + seconds
    await asyncio.gather(*(client(seed, deadline) for seed in range(count)))
    elapsed = time.perf_counter() - started
    return {
        "latencies": latencies,
        "elapsed": elapsed,
        "busy": busy,
        "errors": errors,
        "messages": messages[:5],
        "chosen": chosen,
    }


def _mib(size: float) -> str:
    return f"{size / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, help="the site-packages holding the model wheels")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ratio", type=float, default=3.0, help="the models' total / budget")
    parser.add_argument("--budget", help="the budget (e.g. 207MiB) instead of total / ratio")
    parser.add_argument("--zipf", type=float, default=1.0, help="popularity ~ 1 / rank**zipf")
    parser.add_argument("--generated", action="store_true", help="generated models")
    parser.add_argument("--output", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch) / "repo"
        repo.mkdir()
        log = Path(scratch) / "server.log"
        feeds = build_repository(repo, args.site, args.generated)
        own, left, sizes = calibrate(repo, log, list(feeds))
        total = sum(sizes.values())
        names = list(feeds)
        weights = [1.0 / (rank + 1) ** args.zipf for rank in range(len(names))]
        mean_request = sum(
            w * sum(a.nbytes for a in feeds[n].values()) for n, w in zip(names, weights)
        ) / sum(weights)
        budget = int(total / args.ratio) if args.budget is None else parse_bytes(args.budget)
        print(f"server alone {_mib(own)}; models {_mib(total)} in all; budget {_mib(budget)}")
        for name, size in sizes.items():
            print(f"  {name:14} {_mib(size):>9}")
        with server(repo, log, "--memory-budget", str(budget)) as (url, process):
            sampler = Sampler(process)
            sampler.start()
            result = asyncio.run(clients(url, feeds, args.clients, args.seconds, args.zipf))
            sampler.stop.set()
            sampler.join()
            figures = metrics(url)
        server_log = log.read_text()
    latencies = np.array(result["latencies"])
    peak = max(sampler.samples)
    over = peak - own - budget
    summed = {
        key: sum(values.values())
        for key, values in figures.items()
        if key.endswith(("_total", "_sum", "_count"))
    }
    report = {
        "models": sizes,
        "server_alone_bytes": own,
        "budget_bytes": budget,
        "clients": args.clients,
        "seconds": result["elapsed"],
        "requests_per_s": len(latencies) / result["elapsed"],
        "p50_ms": float(np.percentile(latencies, 50) * 1000) if len(latencies) else None,
        "p99_ms": float(np.percentile(latencies, 99) * 1000) if len(latencies) else None,
        "answered": len(latencies),
        "retryable_503": result["busy"],
        "errors": result["errors"],
        "error_samples": result["messages"],
        "chosen": result["chosen"],
        "loads": summed.get("aioinfer_model_loads_total", 0),
        "failed_loads": summed.get("aioinfer_model_failed_loads_total", 0),
        "evictions": summed.get("aioinfer_model_evictions_total", 0),
        "hits": summed.get("aioinfer_model_hits_total", 0),
        "misses": summed.get("aioinfer_model_misses_total", 0),
        "load_seconds_mean": summed.get("aioinfer_model_load_duration_seconds_sum", 0)
        / max(1, summed.get("aioinfer_model_load_duration_seconds_count", 0)),
        "peak_bytes": peak,
        "peak_over_alone_plus_budget_bytes": over,
        "first_load_left_bytes": left,
        "mean_request_bytes": mean_request,
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores",
        "server_warnings": [line for line in server_log.splitlines() if "WARNING" in line][:5],
    }
    print(
        f"{report['requests_per_s']:.1f} requests/s, p50 {report['p50_ms']:.0f} ms, "
        f"p99 {report['p99_ms']:.0f} ms; {report['answered']} answered, "
        f"{report['retryable_503']} retryable 503s, {report['errors']} errors"
    )
    hit_rate = report["hits"] / max(1, report["hits"] + report["misses"])
    print(
        f"loads {report['loads']:.0f} (failed {report['failed_loads']:.0f}), evictions "
        f"{report['evictions']:.0f}, hit rate {hit_rate:.3f}, mean load "
        f"{report['load_seconds_mean']:.2f} s"
    )
    print(
        f"peak resident {_mib(peak)} = server alone {_mib(own)} + budget {_mib(budget)} "
        f"{'+' if over >= 0 else '-'} {_mib(abs(over))}"
    )
    bodies = 2 * args.clients * mean_request
    print(
        f"  on top of the budget: the first load left {_mib(left)} once unloaded (the "
        f"engine's libraries); {args.clients} requests of the mean size, twice (as received "
        f"and batched): {_mib(bodies)}"
    )
    for sample in report["error_samples"]:
        print("  error:", sample)
    for line in report["server_warnings"]:
        print("  server:", line)
    if report["errors"]:
        print(server_log[-3000:])
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
