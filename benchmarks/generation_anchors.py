"""The anchors of ``benchmarks/generation.py``, run in a process of their own environment.

    python benchmarks/generation_anchors.py openvino_genai MODEL_DIR
    python benchmarks/generation_anchors.py onnxruntime MODEL_DIR

Runs in the environment of the exporters (openvino-genai, onnxruntime; see
``benchmarks/generation.py``), not aioinfer's, so it imports nothing of aioinfer. It
loads one engine, says ``READY {...}`` (versions, settings) on stdout, then answers each
request line on stdin (JSON: ``prompts``, a list of token-id lists, and
``max_new_tokens``) with one ``RESULT {...}`` line: for each stream, its tokens and the
seconds from the start of the run at which each token was available to the caller.
Both anchors generate greedily and ignore end-of-sequence tokens.

- ``openvino_genai``: ``ContinuousBatchingPipeline`` on ``MODEL_DIR/openvino`` (fp32 IR
  from ``optimum-cli export openvino``), fp32 compute and KV cache, prefix caching off
  (every run has new prompts anyway); all requests are added at the start and the
  pipeline is stepped until they finish, reading each request's new tokens after every
  step (what ``generate`` does inside, with a streamer per request).
- ``onnxruntime``: one ``InferenceSession`` on ``MODEL_DIR/onnx/model.onnx`` (default
  options: intra-op threads for the cores, spinning on); the prompts as one left-padded
  batch (attention mask and positions per row), the KV cache fed back each step, every
  stream's token available when the step ends.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Result = dict[str, list[list[Any]]]


def openvino_genai_runner(model_dir: Path) -> tuple[dict[str, Any], Callable[..., Result]]:
    """The OpenVINO GenAI continuous-batching pipeline and its description."""
    import openvino as ov
    import openvino_genai

    scheduler = openvino_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    properties = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}
    pipeline = openvino_genai.ContinuousBatchingPipeline(
        str(model_dir / "openvino"), scheduler, "CPU", properties
    )
    ids = iter(range(1 << 62))

    def run(prompts: list[list[int]], max_new_tokens: int) -> Result:
        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = max_new_tokens
        config.ignore_eos = True
        config.do_sample = False
        tokens: list[list[int]] = [[] for _ in prompts]
        times: list[list[float]] = [[] for _ in prompts]
        start = time.perf_counter()
        handles = [
            pipeline.add_request(next(ids), ov.Tensor(np.array([p], np.int64)), config)
            for p in prompts
        ]
        while pipeline.has_non_finished_requests():
            pipeline.step()
            now = time.perf_counter() - start
            for handle, stream, stamps in zip(handles, tokens, times, strict=True):
                if handle.can_read():
                    for output in handle.read().values():
                        stream.extend(output.generated_ids)
                        stamps.extend([now] * len(output.generated_ids))
        return {"tokens": tokens, "times": times}

    about = {
        "openvino": ov.get_version(),
        "openvino_genai": openvino_genai.get_version(),
        "scheduler": scheduler.to_string().replace("\n", " "),
        "properties": properties,
    }
    return about, run


def onnxruntime_runner(model_dir: Path) -> tuple[dict[str, Any], Callable[..., Result]]:
    """A lockstep padded batch on one onnxruntime session, and its description."""
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(model_dir / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    outputs = [o.name for o in session.get_outputs()]

    def run(prompts: list[list[int]], max_new_tokens: int) -> Result:
        rows, width = len(prompts), max(map(len, prompts))
        ids = np.zeros((rows, width), np.int64)
        mask = np.zeros((rows, width), np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt
            mask[row, width - len(prompt) :] = 1
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        feeds: dict[str, np.ndarray] = {
            p.name: np.zeros((rows, p.shape[1], 0, p.shape[3]), np.float32) for p in pasts
        }
        tokens: list[list[int]] = [[] for _ in prompts]
        times: list[list[float]] = [[] for _ in prompts]
        start = time.perf_counter()
        for _ in range(max_new_tokens):
            feeds.update(input_ids=ids, attention_mask=mask, position_ids=positions)
            results = dict(zip(outputs, session.run(None, feeds), strict=True))
            picked = results["logits"][:, -1].argmax(-1)
            now = time.perf_counter() - start
            for stream, stamps, token in zip(tokens, times, picked.tolist(), strict=True):
                stream.append(token)
                stamps.append(now)
            for p in pasts:
                feeds[p.name] = results[p.name.replace("past_key_values.", "present.")]
            ids = picked[:, None].astype(np.int64)
            positions = positions[:, -1:] + 1
            mask = np.concatenate([mask, np.ones((rows, 1), np.int64)], axis=1)
        return {"tokens": tokens, "times": times}

    about = {"onnxruntime": ort.__version__, "intra_op_threads": "default (the cores)"}
    return about, run


RUNNERS = {"openvino_genai": openvino_genai_runner, "onnxruntime": onnxruntime_runner}


def main() -> None:
    engine, model_dir = sys.argv[1], Path(sys.argv[2])
    about, run = RUNNERS[engine](model_dir)
    print("READY " + json.dumps(about), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        result = run(request["prompts"], request["max_new_tokens"])
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
