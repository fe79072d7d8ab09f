"""The glue anchor of ``benchmarks/embeddings_server.py``: what a user writes by hand to
serve a sentence-transformers folder with OpenAI's ``/v1/embeddings`` — FastAPI, the
``tokenizers`` library, one onnxruntime ``InferenceSession`` (default options), each
request tokenized, padded to its longest text, run, mean-pooled and normalized in
``anyio.to_thread`` (requests are not batched together).

    python -m benchmarks.embeddings_glue_server MODEL_DIR PORT
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import numpy as np


def max_seq_length(model_dir: Path) -> int:
    """sentence-transformers' truncation of the folder: its ``max_seq_length``, or its
    tokenizer's ``model_max_length`` (as aioinfer reads the folder)."""
    from aioinfer.pipelines.folder import read_folder

    return read_folder(model_dir).max_length or 512


def make_app(model_dir: Path) -> Any:
    import anyio
    import onnxruntime
    from fastapi import FastAPI
    from tokenizers import Tokenizer

    onnx = model_dir / "onnx" / "model.onnx"
    session = onnxruntime.InferenceSession(
        str(onnx if onnx.is_file() else model_dir / "model.onnx"),
        providers=["CPUExecutionProvider"],
    )
    names = {i.name for i in session.get_inputs()}
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_seq_length(model_dir))
    tokenizer.enable_padding()

    def embed(texts: list[str]) -> tuple[np.ndarray, int]:
        encoded = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        tokens = session.run(None, {k: v for k, v in feed.items() if k in names})[0]
        pooled = (tokens * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        vectors = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return vectors.astype(np.float32), int(mask.sum())

    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(body: dict[str, Any]) -> dict[str, Any]:
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vectors, tokens = await anyio.to_thread.run_sync(embed, texts)
        as_base64 = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.tobytes()).decode() if as_base64 else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": body["model"], "usage": usage}

    return app


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        make_app(Path(sys.argv[1])), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
    )
