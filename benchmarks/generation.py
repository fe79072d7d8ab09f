"""Token generation with N concurrent streams: aioinfer against OpenVINO GenAI's continuous
batching and a lockstep onnxruntime batch, on the same random-weight Llama decoder.

    python -m benchmarks.generation --anchor-python ENV/bin/python
        [--streams 1 8 32] [--rounds 2] [--prompt-tokens 64] [--new-tokens 64]
        [--decoder default all-logits] [--model-dir DIR] [--anchors openvino_genai onnxruntime]
        [--output table.md]

The decoder is ``scripts/make_decoder.py --bench``'s (8 layers, hidden 512, 8 heads over
4 KV heads, vocabulary 32,000: 58M parameters, random weights), exported by optimum to
ONNX and to fp32 OpenVINO IR; it is made on the first run into ``--model-dir`` (default:
``aioinfer/bench-decoder`` in the user's cache folder, about 500 MB), not committed.

- **aioinfer**, in this process: ``compile_model(model, config={"STATEFUL": "auto"})``
  (no device named: AUTO's choice is printed) and N concurrent ``aioinfer.generate``
  calls on it, one task each, under asyncio. That compile groups the query heads of the
  grouped-query attention (the KV heads are not repeated at every step) and, ``LOGITS``
  being ``LAST`` by default for such a decoder, keeps the logits of each prompt's last
  position only. ``--decoder all-logits`` runs the decoder with ``LOGITS`` ``ALL`` (every
  position projected onto the vocabulary, as exported) instead, or beside it
  (``--decoder default all-logits``: the row ``aioinfer (LOGITS ALL)``).
- **OpenVINO GenAI** ``ContinuousBatchingPipeline`` (fp32 compute and KV cache) and
  **onnxruntime** with the N prompts as one padded batch in lockstep, each in a worker
  process of the exporters' environment (``benchmarks/generation_anchors.py``; it
  describes both). Make that environment once (``torch==2.13.0`` exactly: another
  version brings a CUDA build)::

      python3 -m venv ENV
      ENV/bin/pip install torch==2.13.0 "optimum-intel[openvino]==1.27.0" \\
          "optimum-onnx[onnxruntime]==0.1.0" openvino==2026.4.1 \\
          openvino-genai==2026.4.1.0 openvino-tokenizers==2026.4.1.0 onnxruntime==1.32.0

Every stream has its own prompt of ``--prompt-tokens`` random token ids (new ones for
every run: no engine can reuse a cached prefix) and generates ``--new-tokens`` tokens
greedily, end-of-sequence ignored; all N streams start at once. The engines take turns
within each round and each N (the order rotates by round), each turn starting with an
untimed warm-up run on other prompts (onnxruntime's spinning threads tax whatever runs
right after it). Per engine and N: generated tokens/s (all streams' tokens over the time
to the last one; the median over rounds), time to first token (each stream's, from the
start; p50 and p99 over streams and rounds) and inter-token latency (between a stream's
consecutive tokens, as its consumer sees them; p50 and p99 over all). Each engine's
greedy tokens are compared with onnxruntime's: the count of streams whose tokens are all
the same is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import numpy as np

import aioinfer as ai
from benchmarks.compare import machine

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = ("openvino_genai", "onnxruntime")
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "default": ("aioinfer", {"STATEFUL": "auto"}),
    "all-logits": ("aioinfer (LOGITS ALL)", {"STATEFUL": "auto", "LOGITS": "ALL"}),
}
"""aioinfer's compiles of the decoder: the engine's name and the compile config."""
SEED = 20261207


def default_model_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "aioinfer" / "bench-decoder"


@dataclass
class Run:
    """One timed run of one engine: per stream, its tokens and when each arrived
    (seconds from the start)."""

    tokens: list[list[int]]
    times: list[list[float]]

    def tokens_per_second(self) -> float:
        return sum(map(len, self.tokens)) / max(t[-1] for t in self.times)

    def first_token(self) -> list[float]:
        return [t[0] for t in self.times]

    def inter_token(self) -> list[float]:
        return [float(d) for t in self.times for d in np.diff(t)]


@dataclass
class Figures:
    """The runs of one engine at one N."""

    runs: list[Run] = field(default_factory=list)
    same_tokens: list[int] = field(default_factory=list)
    """Per run: streams whose tokens equal onnxruntime's (when it ran)."""

    def tokens_per_second(self) -> float:
        """The median over the runs."""
        return statistics.median(run.tokens_per_second() for run in self.runs)

    def row(self, engine: str, streams: int, anchor: Figures | None) -> str:
        """The table's row; ``anchor``: OpenVINO GenAI's figures at the same N."""
        ttft = [t for run in self.runs for t in run.first_token()]
        itl = [t for run in self.runs for t in run.inter_token()]
        rate = self.tokens_per_second()
        ratio = f"{rate / anchor.tokens_per_second():.2f}x" if anchor else "-"
        agree = "/".join(map(str, self.same_tokens)) + f" of {streams}" if self.same_tokens else "-"
        return (
            f"| {streams} | {engine} | {rate:,.0f} | {ratio} | {ms(ttft, 50)} | {ms(ttft, 99)} | "
            f"{ms(itl, 50)} | {ms(itl, 99)} | {agree} |"
        )


def ms(values: list[float], percentile: float) -> str:
    if not values:
        return "-"
    value = float(np.percentile(values, percentile)) * 1000
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``count`` prompts of ``length`` random token ids (3 and up: not bos, eos or unk)."""
    rng = np.random.default_rng(seed)
    return rng.integers(3, vocab, (count, length)).tolist()


class Anchor:
    """An anchor engine in a worker process of the exporters' environment."""

    def __init__(self, engine: str, python: str, model_dir: Path) -> None:
        self.engine = engine
        script = str(Path(__file__).with_name("generation_anchors.py"))
        self.process = subprocess.Popen(
            [python, script, engine, str(model_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.about = json.loads(self._reply("READY "))

    def _reply(self, prefix: str) -> str:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"the {self.engine} worker exited ({self.process.wait()})")

    def run(self, batch: list[list[int]], new_tokens: int) -> Run:
        assert self.process.stdin is not None
        request = {"prompts": batch, "max_new_tokens": new_tokens}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self._reply("RESULT "))
        return Run(reply["tokens"], reply["times"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


async def aioinfer_run(compiled: ai.CompiledModel, batch: list[list[int]], new_tokens: int) -> Run:
    """N concurrent ``aioinfer.generate`` calls, each timing its tokens as it gets them."""
    tokens: list[list[int]] = [[] for _ in batch]
    times: list[list[float]] = [[] for _ in batch]
    start = time.perf_counter()

    async def stream(index: int) -> None:
        generation = ai.generate(compiled, batch[index], max_new_tokens=new_tokens)
        async with contextlib.aclosing(generation) as generated:
            async for token in generated:
                times[index].append(time.perf_counter() - start)
                tokens[index].append(token)

    async with anyio.create_task_group() as group:
        for index in range(len(batch)):
            group.start_soon(stream, index)
    return Run(tokens, times)


def ensure_model(model_dir: Path, python: str | None) -> None:
    """Make the benchmark's decoder into ``model_dir`` unless it is there."""
    if (model_dir / "onnx" / "model.onnx").exists() and (
        model_dir / "openvino" / "openvino_model.xml"
    ).exists():
        return
    if python is None:
        raise SystemExit(f"no decoder in {model_dir}: pass --anchor-python to make it")
    print(f"making the decoder into {model_dir} (a few minutes)", flush=True)
    script = ROOT / "scripts" / "make_decoder.py"
    subprocess.run([python, str(script), "--bench", "--out", str(model_dir)], check=True)


def load() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor-python", help="Python of the exporters' environment")
    parser.add_argument("--anchors", nargs="*", choices=ANCHORS, default=list(ANCHORS))
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--warmup-tokens", type=int, default=4)
    parser.add_argument(
        "--decoder",
        nargs="+",
        choices=tuple(VARIANTS),
        default=["default"],
        help="aioinfer's compile: the default, with LOGITS ALL, or both",
    )
    parser.add_argument("--output", type=Path, help="also write the table here")
    args = parser.parse_args()
    if args.anchors and args.anchor_python is None:
        parser.error("the anchors need --anchor-python (or pass --anchors with no name)")
    ensure_model(args.model_dir, args.anchor_python)
    vocab = json.loads((args.model_dir / "onnx" / "config.json").read_text())["vocab_size"]

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"machine: {machine()}; load average {load()}; {started}", flush=True)
    core = ai.Core()
    exported = core.read_model(args.model_dir / "onnx" / "model.onnx")
    compiled = {
        VARIANTS[kind][0]: core.compile_model(exported, config=VARIANTS[kind][1])
        for kind in args.decoder
    }
    devices = ", ".join(next(iter(compiled.values())).get_property("EXECUTION_DEVICES"))
    print(f"aioinfer {ai.__version__}: AUTO compiled the decoder on {devices}", flush=True)
    anchors = {name: Anchor(name, args.anchor_python, args.model_dir) for name in args.anchors}
    for name, anchor in anchors.items():
        print(f"{name}: {json.dumps(anchor.about)}", flush=True)

    def run(engine: str, batch: list[list[int]], new_tokens: int) -> Run:
        if engine in compiled:
            return anyio.run(aioinfer_run, compiled[engine], batch, new_tokens)
        return anchors[engine].run(batch, new_tokens)

    engines = [*compiled, *anchors]
    figures = {(e, n): Figures() for e in engines for n in args.streams}
    try:
        for round_ in range(args.rounds):
            order = engines[round_ % len(engines) :] + engines[: round_ % len(engines)]
            for n in args.streams:
                batch = prompts(n, args.prompt_tokens, vocab, SEED + 1000 * round_ + n)
                warmup = prompts(n, args.prompt_tokens, vocab, SEED - 1000 * round_ - n)
                runs: dict[str, Run] = {}
                for engine in order:
                    run(engine, warmup, args.warmup_tokens)
                    runs[engine] = result = run(engine, batch, args.new_tokens)
                    figures[engine, n].runs.append(result)
                    print(
                        f"round {round_ + 1}, N={n}, {engine}: "
                        f"{result.tokens_per_second():,.0f} tokens/s, first token "
                        f"{max(result.first_token()) * 1000:.0f} ms at worst; load {load()}",
                        flush=True,
                    )
                if "onnxruntime" in runs:
                    for engine, result in runs.items():
                        same = sum(
                            a == b
                            for a, b in zip(result.tokens, runs["onnxruntime"].tokens, strict=True)
                        )
                        figures[engine, n].same_tokens.append(same)
    finally:
        for anchor in anchors.values():
            anchor.close()

    lines = [
        f"Machine: {machine()}. {started}, load average at the end {load()}. "
        f"{args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, greedy, "
        f"{args.rounds} rounds; aioinfer on {devices}.",
        "",
        "| N streams | engine | tokens/s | tokens/s / OpenVINO GenAI's | TTFT p50 | TTFT p99 | "
        "inter-token p50 | inter-token p99 | same tokens as onnxruntime |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in args.streams:
        anchor = figures.get(("openvino_genai", n))
        lines += [figures[e, n].row(e, n, anchor) for e in engines]
    low, high = min(args.streams), max(args.streams)
    if low != high:
        lines.append("")
        for engine in compiled:
            gain = figures[engine, high].tokens_per_second()
            gain /= figures[engine, low].tokens_per_second()
            lines.append(f"{engine}'s tokens/s at N={high}: {gain:.1f}x its own at N={low}.")
    table = "\n".join(lines)
    print("\n" + table)
    if args.output:
        args.output.write_text(table + "\n")


if __name__ == "__main__":
    sys.exit(main())
