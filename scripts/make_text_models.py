"""Make small random-weight BERT text models, saved as users download them, with
sentence-transformers' outputs as the reference.

Three folders under ``tests/data/text/`` (a tiny BERT: 2 layers, hidden 32, a WordPiece
vocabulary trained with ``tokenizers`` on a few sentences):

- ``st-embedder/``: a sentence-transformers folder (``modules.json``, ``1_Pooling``
  with mean pooling, ``2_Normalize``, ``sentence_bert_config.json`` with
  ``max_seq_length`` 24, prompts in ``config_sentence_transformers.json``) with its
  ``onnx/model.onnx`` as sentence-transformers' ONNX backend exports it;
- ``feature-extraction/``: the same encoder exported by optimum with ``--task
  feature-extraction`` (``model.onnx`` at the root, no pooling config; the tokenizer's
  ``model_max_length`` 48);
- ``cross-encoder/``: a ``BertForSequenceClassification`` with one label, exported by
  optimum with ``--task text-classification``.

``reference.json`` holds the texts and sentence-transformers' outputs on the same
weights: ``encode`` with and without normalization, with a prompt, truncated to 16
dimensions (``truncate_dim``, renormalized), the feature-extraction folder's mean
pooling, and ``CrossEncoder.predict`` (its default: the sigmoid of the one logit).

Needs torch, sentence-transformers and optimum (not aioinfer's dependencies)::

    python3 -m venv venv-st
    venv-st/bin/pip install torch==2.13.0 "sentence-transformers[onnx]" \\
        "optimum-onnx[onnxruntime]==0.1.0"
    venv-st/bin/python scripts/make_text_models.py            # tests/data/text/
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import sentence_transformers
import tokenizers
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers import models as st_models
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
)

SEED = 20261207
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "text"
ST_MAX_SEQ_LENGTH = 24
TOKENIZER_MAX_LENGTH = 48
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "An asyncio runtime serves many embeddings at once, batched by tokens.",
    "Search engines rank documents by how well they answer the query.",
    "Retrieval augmented generation looks up passages before it answers.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Small models make fast tests; random weights make varied vectors.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "A cat sat on the mat while the dog slept by the fire.",
]
TEXTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "Embeddings turn sentences into vectors.",
    "a",
    "Unseen wörds like zyxwv and qqq map to unknown pieces.",
    # Longer than max_seq_length (24): sentence-transformers truncates it.
    " ".join(CORPUS[:4]),
    "Paris",
]
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The quick brown fox jumps over the lazy dog.",
    "France",
    " ".join(CORPUS),  # longer than the cross-encoder's max length
]
PROMPTS = {"query": "query: ", "document": "passage: "}


def train_tokenizer() -> BertTokenizerFast:
    """A BERT WordPiece tokenizer (lower-casing, [CLS] ... [SEP]) trained on CORPUS."""
    model = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    model.normalizer = normalizers.BertNormalizer(lowercase=True)
    model.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    model.decoder = decoders.WordPiece()
    model.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=400, special_tokens=SPECIALS)
    )
    cls, sep = model.token_to_id("[CLS]"), model.token_to_id("[SEP]")
    model.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return BertTokenizerFast(
        tokenizer_object=model,
        model_max_length=TOKENIZER_MAX_LENGTH,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def bert_config(vocab_size: int, **extra: object) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,
        **extra,
    )


def optimum_export(model_dir: Path, out: Path, task: str) -> None:
    command = [sys.executable, "-m", "optimum.exporters.onnx", "--model", str(model_dir)]
    subprocess.run([*command, "--task", task, "--opset", "17", str(out)], check=True)


def make_embedders(out: Path, tokenizer: BertTokenizerFast, work: Path) -> dict[str, object]:
    torch.manual_seed(SEED)
    hf_dir = work / "bert"
    BertModel(bert_config(len(tokenizer))).eval().save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)

    st_dir = out / "st-embedder"
    transformer = st_models.Transformer(str(hf_dir), max_seq_length=ST_MAX_SEQ_LENGTH)
    pooling = st_models.Pooling(transformer.get_word_embedding_dimension(), "mean")
    model = SentenceTransformer(
        modules=[transformer, pooling, st_models.Normalize()], prompts=PROMPTS
    )
    model.save(str(st_dir))
    onnx_model = SentenceTransformer(str(st_dir), backend="onnx")
    onnx_model.save(str(st_dir))  # writes onnx/model.onnx beside the torch weights

    torch_model = SentenceTransformer(str(st_dir))  # the reference runs on torch
    raw = SentenceTransformer(modules=[transformer, pooling])  # no Normalize module

    fe_dir = out / "feature-extraction"
    optimum_export(hf_dir, fe_dir, "feature-extraction")
    fe_model = SentenceTransformer(
        modules=[
            st_models.Transformer(str(hf_dir), max_seq_length=TOKENIZER_MAX_LENGTH),
            st_models.Pooling(32, "mean"),
        ]
    )

    def encode(st: SentenceTransformer, **options: object) -> list[list[float]]:
        vectors = st.encode(TEXTS, convert_to_numpy=True, batch_size=32, **options)
        return np.asarray(vectors, dtype=np.float32).tolist()

    return {
        "texts": TEXTS,
        "max_seq_length": ST_MAX_SEQ_LENGTH,
        "tokenizer_max_length": TOKENIZER_MAX_LENGTH,
        "normalized": encode(torch_model),
        "unnormalized": encode(raw),
        "query_prompt": encode(torch_model, prompt_name="query"),
        "truncate_dim_16": encode(torch_model, truncate_dim=16, normalize_embeddings=True),
        "feature_extraction": encode(fe_model),
        "token_counts": [
            len(ids)
            for ids in tokenizer(TEXTS, truncation=True, max_length=ST_MAX_SEQ_LENGTH)["input_ids"]
        ],
    }


def make_cross_encoder(out: Path, tokenizer: BertTokenizerFast, work: Path) -> dict[str, object]:
    torch.manual_seed(SEED + 1)
    hf_dir = work / "cross"
    BertForSequenceClassification(bert_config(len(tokenizer), num_labels=1)).eval().save_pretrained(
        hf_dir
    )
    tokenizer.save_pretrained(hf_dir)
    optimum_export(hf_dir, out / "cross-encoder", "text-classification")
    cross = CrossEncoder(str(hf_dir), max_length=TOKENIZER_MAX_LENGTH)
    pairs = [(QUERY, document) for document in DOCUMENTS]
    return {
        "query": QUERY,
        "documents": DOCUMENTS,
        "scores": np.asarray(cross.predict(pairs), dtype=np.float64).tolist(),
        "logits": np.asarray(
            cross.predict(pairs, activation_fn=torch.nn.Identity()), dtype=np.float64
        ).tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tokenizer = train_tokenizer()
    with tempfile.TemporaryDirectory() as work:
        reference = {
            "embeddings": make_embedders(out, tokenizer, Path(work)),
            "rerank": make_cross_encoder(out, tokenizer, Path(work)),
            "versions": {
                "torch": torch.__version__,
                "sentence_transformers": sentence_transformers.__version__,
                "tokenizers": tokenizers.__version__,
            },
        }
    (out / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main()
