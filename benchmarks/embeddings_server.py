"""Embedding servers under 64 concurrent OpenAI clients: ``aioinfer serve FOLDER``
against the onnxruntime glue (``benchmarks/embeddings_glue_server.py``) and infinity-emb,
on all-MiniLM-L6-v2 (the folder of ``benchmarks/embeddings.py``).

    python -m benchmarks.embeddings_server [--model-dir DIR] [--seconds 20]
        [--clients 64] [--rounds 1] [--servers aioinfer,glue,infinity]
        [--infinity-python /work/venv-infinity/bin/python] [--output table.md]

Each server runs in its own process on a free 127.0.0.1 port, one at a time, in an
order that rotates every round. The load: ``--clients`` tasks, each with its own
``openai.AsyncOpenAI`` client, each sending requests of 1-8 sentences of mixed lengths
(``benchmarks.embeddings.make_sentences``: log-normal token counts, median about 28,
5 to 296) back to back for ``--seconds`` after a warm-up; the client asks base64, as
the openai client does by default. Reported: sentences/s, the median and 99th
percentile latency of a request, and the smallest cosine between a server's vectors
and onnxruntime's own (the glue's computation, equal to sentence-transformers' within
1e-5: ``benchmarks/embeddings.py``) over the requests of the run.

infinity-emb has dependency pins of its own: give it its own environment (and the
``--infinity-python`` of it)::

    python3 -m venv /work/venv-infinity
    /work/venv-infinity/bin/pip install "infinity-emb[all]"

It runs with its optimum (onnxruntime) engine on the same ``onnx/model.onnx``, from a
folder of links (:func:`infinity_view`: infinity-emb 0.0.78 hands optimum 2 an absolute
ONNX path, which optimum refuses); its torch engine would need the model's torch
weights, which the exported folder does not hold. It is told the folder's pooling
(``--pooling-method mean``): its automatic choice gave vectors far from
sentence-transformers' (smallest cosine 0.23).

A server that is missing is reported as such, and the others are still measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import numpy as np

from benchmarks.embeddings import default_model_dir, make_sentences
from benchmarks.embeddings_glue_server import max_seq_length

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(name: str, model_dir: Path, port: int, infinity_python: str) -> list[str]:
    if name == "aioinfer":
        return [sys.executable, "-m", "aioinfer.cli", "serve", str(model_dir), "--port", str(port)]
    if name == "glue":
        return [
            sys.executable,
            "-m",
            "benchmarks.embeddings_glue_server",
            str(model_dir),
            str(port),
        ]
    if name == "infinity":
        # run in infinity_view(): its optimum engine finds only relative ONNX paths
        return [
            str(Path(infinity_python).with_name("infinity_emb")), "v2", "--log-level", "warning",
            "--model-id", ".", "--served-model-name", model_dir.name,
            "--engine", "optimum", "--pooling-method", "mean", "--port", str(port),
            "--url-prefix", "/v1",
        ]  # fmt: skip
    raise ValueError(f"unknown server {name!r}")


def infinity_view(model_dir: Path) -> Path:
    """The folder as infinity-emb 0.0.78's optimum engine reads it (with optimum 2): the
    ONNX model at the top (a link to ``onnx/model.onnx``), beside links to the other
    files; it is run from there with ``--model-id .``."""
    view = Path(tempfile.gettempdir()) / f"infinity-view-{model_dir.name}"
    view.mkdir(exist_ok=True)
    for item in [*model_dir.iterdir(), model_dir / "onnx" / "model.onnx"]:
        if item.name != "onnx" and not (view / item.name).exists():
            (view / item.name).symlink_to(item.resolve())
    return view


@contextmanager
def running(
    command: list[str], port: int, cwd: Path = ROOT, timeout: float = 300
) -> Iterator[None]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    process = subprocess.Popen(command, cwd=cwd, env=env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[:4]} exited with {process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{command[:4]} did not listen in {timeout} s") from None
                time.sleep(0.3)
        yield
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def load(
    url: str, model: str, sentences: list[str], clients: int, seconds: float
) -> tuple[int, list[float], list[tuple[list[str], np.ndarray]]]:
    """(sentences embedded, latencies of the requests, a sample of (texts, vectors))."""
    import openai

    done = 0
    latencies: list[float] = []
    sample: list[tuple[list[str], np.ndarray]] = []
    rng = random.Random(7)
    warm = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    for _ in range(3):
        await warm.embeddings.create(model=model, input=rng.sample(sentences, 8))
    await warm.close()
    end = time.perf_counter() + seconds

    async def client(seed: int) -> None:
        nonlocal done
        local = random.Random(seed)
        async with openai.AsyncOpenAI(
            base_url=url, api_key="none", max_retries=0, timeout=600
        ) as api:
            while time.perf_counter() < end:
                texts = local.sample(sentences, local.randint(1, 8))
                start = time.perf_counter()
                answer = await api.embeddings.create(model=model, input=texts)
                now = time.perf_counter()
                if now <= end:
                    latencies.append(now - start)
                    done += len(texts)
                if len(sample) < 200:
                    sample.append((texts, np.array([d.embedding for d in answer.data])))

    async with anyio.create_task_group() as group:
        for index in range(clients):
            group.start_soon(client, index)
    return done, latencies, sample


def min_cosine(model_dir: Path, sample: list[tuple[list[str], np.ndarray]]) -> float:
    import onnxruntime
    from tokenizers import Tokenizer

    session = onnxruntime.InferenceSession(
        str(model_dir / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in session.get_inputs()}
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_seq_length(model_dir))
    tokenizer.no_padding()  # the folder's tokenizer.json may pad to a fixed length
    worst = 1.0
    for texts, vectors in sample:
        for text, vector in zip(texts, vectors):
            e = tokenizer.encode(text)
            ids = np.array([e.ids], dtype=np.int64)
            feed = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids),
            }
            tokens = session.run(None, {k: v for k, v in feed.items() if k in names})[0]
            ref = tokens[0].mean(0)
            cos = float(ref @ vector / np.linalg.norm(ref) / np.linalg.norm(vector))
            worst = min(worst, cos)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--servers", default="aioinfer,glue,infinity")
    parser.add_argument("--infinity-python", default="/work/venv-infinity/bin/python")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    sentences = make_sentences(args.model_dir, 2000)
    names = args.servers.split(",")
    results: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n in names}
    missing: dict[str, str] = {}
    for round_index in range(args.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            if name in missing:
                continue
            if name == "infinity" and not Path(args.infinity_python).exists():
                missing[name] = f"no {args.infinity_python} (see the module's docstring)"
                continue
            port = free_port()
            command = server_command(name, args.model_dir, port, args.infinity_python)
            try:
                cwd = infinity_view(args.model_dir) if name == "infinity" else ROOT
                with running(command, port, cwd):
                    url = f"http://127.0.0.1:{port}/v1"
                    done, latencies, sample = anyio.run(
                        load, url, args.model_dir.name, sentences, args.clients, args.seconds
                    )
            except RuntimeError as exc:
                missing[name] = str(exc)
                continue
            cut = statistics.quantiles(latencies, n=100)
            figures = (
                done / args.seconds,
                statistics.median(latencies),
                cut[98],
                min_cosine(args.model_dir, sample),
            )
            results[name].append(figures)
            print(f"round {round_index} {name}: {figures[0]:.1f} sentences/s, p50 "
                  f"{figures[1]:.2f} s, p99 {figures[2]:.2f} s, min cosine {figures[3]:.6f}",
                  flush=True)  # fmt: skip
    cpu = platform.processor() or "?"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in lscpu.splitlines()
            if line.startswith("Model name")
        )
    except (OSError, StopIteration):
        pass
    lines = [
        f"{args.clients} concurrent AsyncOpenAI clients, 1-8 sentences per request, "
        f"{args.seconds:g} s per server, {args.rounds} round(s), {cpu}, {os.cpu_count()} cores",
        "",
        "| server | sentences/s | p50 | p99 | min cosine |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        if not runs:
            lines.append(f"| {name} | {missing.get(name, 'not run')} | | | |")
            continue
        rate, p50, p99, worst = (statistics.median(column) for column in zip(*runs))
        lines.append(f"| {name} | {rate:.1f} | {p50:.2f} s | {p99:.2f} s | {worst:.6f} |")
    table = "\n".join(lines)
    print(table)
    if args.output:
        args.output.write_text(table + "\n")


if __name__ == "__main__":
    main()
