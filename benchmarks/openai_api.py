"""OpenAI's API against in-process generation: what the HTTP and text layers cost.

    python -m benchmarks.openai_api [--streams 32] [--rounds 3] [--prompt-words 40]
        [--new-tokens 64] [--model-dir DIR] [--output table.md]

The decoder is ``scripts/make_decoder.py --bench``'s optimum folder (``DIR/onnx``: 58M
parameters, random weights; see ``benchmarks/generation.py``, which makes it on its
first run), served as it is: ``aioinfer serve DIR/onnx --model-name bench`` in a process
of its own, on a free 127.0.0.1 port.

- **openai**: N concurrent ``AsyncOpenAI`` streaming chat completions (one task each,
  in this process), greedy, ``max_tokens`` tokens each, end-of-sequence ignored
  (``ignore_eos``), usage included.
- **in-process**: the same chat prompts rendered by the folder's template and encoded
  (outside the timing), then N concurrent ``aioinfer.generate`` calls on the model
  compiled in this process with ``STATEFUL`` ``"auto"``.

The two take turns within each round (the order alternates by round). Per engine:
generated tokens/s (all streams' tokens over the time to the last one; the median over
rounds), and time to first token (each stream's, from the start; p50 and p99 over
streams and rounds). The ratio of the tokens/s is the cost of the HTTP and text layers;
it is printed per round too (the two runs of a round are next to each other in time, so
their ratio is the least affected by other load on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import openai

import aioinfer as ai
from aioinfer.text import TextGenerator
from benchmarks.generation import default_model_dir

MODEL = "bench"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def chats(count: int, words: int, seed: int) -> list[list[dict[str, str]]]:
    """``count`` one-message chats of ``words`` random words each."""
    rng = np.random.default_rng(seed)
    vocabulary = ["the", "a", "runtime", "serves", "many", "users", "at", "once", "with"]
    vocabulary += ["tokens", "streamed", "as", "they", "come"]
    return [
        [{"role": "user", "content": " ".join(rng.choice(vocabulary, words))}] for _ in range(count)
    ]


class Server:
    """``aioinfer serve`` of the folder in a process of its own."""

    def __init__(self, folder: Path) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aioinfer.cli",
                "serve",
                str(folder),
                "--model-name",
                MODEL,
                "--port",
                "0",
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        stream = self.process.stderr
        assert stream is not None
        threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                found = re.search(r"running on http://127\.0\.0\.1:(\d+)", lines.get(timeout=1))
                if found:
                    self.url = f"http://127.0.0.1:{found.group(1)}/v1"
                    return
        self.close()
        raise SystemExit("the server did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(60)


async def openai_run(
    url: str, prompts: list[list[dict[str, str]]], new_tokens: int
) -> tuple[float, list[float], int]:
    """N concurrent streaming chats: (seconds to the last token, first-token times,
    tokens)."""
    client = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
    firsts: list[float] = []
    counted: list[int] = []
    start = time.perf_counter()

    async def one(messages: list[dict[str, str]]) -> None:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=new_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        first = None
        async for chunk in stream:
            if first is None:
                first = time.perf_counter() - start
            if chunk.usage is not None:
                counted.append(chunk.usage.completion_tokens)
        firsts.append(first or float("nan"))

    await asyncio.gather(*(one(messages) for messages in prompts))
    elapsed = time.perf_counter() - start
    await client.close()
    return elapsed, firsts, sum(counted)


async def local_run(
    compiled: ai.CompiledModel, prompts: list[list[int]], new_tokens: int
) -> tuple[float, list[float], int]:
    """N concurrent ``aioinfer.generate`` calls: as :func:`openai_run`."""
    firsts: list[float] = []
    counted: list[int] = []
    start = time.perf_counter()

    async def one(ids: list[int]) -> None:
        produced = 0
        async with contextlib.aclosing(
            ai.generate(compiled, ids, max_new_tokens=new_tokens)
        ) as tokens:
            async for _ in tokens:
                if produced == 0:
                    firsts.append(time.perf_counter() - start)
                produced += 1
        counted.append(produced)

    await asyncio.gather(*(one(ids) for ids in prompts))
    return time.perf_counter() - start, firsts, sum(counted)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-words", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    folder = args.model_dir / "onnx"
    if not (folder / "model.onnx").exists():
        raise SystemExit(f"no decoder in {folder}: run benchmarks/generation.py once to make it")
    compiled = ai.compile_model(folder / "model.onnx", config={"STATEFUL": "auto"})
    text = TextGenerator.from_folder(compiled, folder)
    server = Server(folder)
    figures: dict[str, dict[str, list[float]]] = {
        name: {"rate": [], "first": []} for name in ("openai", "in-process")
    }
    try:
        warm = chats(args.streams, args.prompt_words, seed=999)
        await openai_run(server.url, warm, 8)
        await local_run(compiled, [await text.prompt_ids(m) for m in warm], 8)
        for round_ in range(args.rounds):
            prompts = chats(args.streams, args.prompt_words, seed=round_)
            ids = [await text.prompt_ids(messages) for messages in prompts]
            order = ["openai", "in-process"] if round_ % 2 == 0 else ["in-process", "openai"]
            for name in order:
                if name == "openai":
                    elapsed, firsts, tokens = await openai_run(server.url, prompts, args.new_tokens)
                else:
                    elapsed, firsts, tokens = await local_run(compiled, ids, args.new_tokens)
                figures[name]["rate"].append(tokens / elapsed)
                figures[name]["first"].extend(firsts)
                print(
                    f"round {round_} {name}: {tokens} tokens, {tokens / elapsed:.0f} tokens/s",
                    flush=True,
                )
    finally:
        server.close()
    rates = {name: statistics.median(f["rate"]) for name, f in figures.items()}
    paired = [a / b for a, b in zip(figures["openai"]["rate"], figures["in-process"]["rate"])]
    lines = [
        f"{args.streams} streams, {args.new_tokens} new tokens each, prompts of "
        f"{len(ids[0])} tokens, {args.rounds} rounds; {_cpu()}",
        "",
        "| engine | tokens/s | vs in-process | TTFT p50 (ms) | TTFT p99 (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, f in figures.items():
        lines.append(
            f"| {name} | {rates[name]:.0f} | {rates[name] / rates['in-process']:.2f}x | "
            f"{percentile(f['first'], 50):.0f} | {percentile(f['first'], 99):.0f} |"
        )
    lines.append("")
    lines.append(
        "openai / in-process tokens/s by round: "
        + ", ".join(f"{ratio:.2f}" for ratio in paired)
        + f" (median {statistics.median(paired):.2f})"
    )
    table = "\n".join(lines)
    print(table)
    if args.output:
        args.output.write_text(table + "\n")


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return f"{os.cpu_count()} cores"


if __name__ == "__main__":
    asyncio.run(main())
