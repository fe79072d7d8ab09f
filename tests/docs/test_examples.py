"""The examples run as documented (each as a subprocess, the way a user runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from examples.models.decoder import SENTENCE

ROOT = Path(__file__).resolve().parents[2]


def run_example(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_generate_recites_the_sentence_with_the_cache_in_the_request() -> None:
    out = run_example("examples/generate.py")
    lines = out.splitlines()
    assert lines[0].startswith("variables: past_key_values.0.key <- present.0.key")
    assert lines[1] == "inputs: input_ids: int64[batch, sequence]"
    # Greedy decoding from the prompt "aioinfer keeps" continues the sentence to its end.
    assert lines[2] == SENTENCE
    words = len(SENTENCE.split())
    assert lines[3].startswith(f"{words - 2} tokens in ")
    # The cache holds every position: the prompt and the tokens fed back after it.
    assert lines[3].endswith(f"past_key_values.0.key: (1, 2, {words - 1}, 16)")


def test_generate_stops_after_max_new_tokens() -> None:
    out = run_example("examples/generate.py", "kv", "cache", "--max-new-tokens", "3")
    assert out.splitlines()[2] == "kv cache inside each infer"


def test_generate_concurrent_streams_sixteen_generations_in_shared_steps() -> None:
    out = run_example("examples/generate_concurrent.py", "--max-new-tokens", "12")
    lines = out.splitlines()
    assert len(lines) == 17
    assert all(": 12 tokens [" in line for line in lines[:16])
    summary = lines[16]
    assert summary.startswith("16 streams, 192 tokens in ")
    # 11 decode steps each, 176 if one at a time: shared steps take far fewer.
    steps = int(summary.split(": ")[1].split()[0])
    assert steps < 60, summary
