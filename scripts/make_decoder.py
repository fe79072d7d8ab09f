"""Make small random-weight Llama decoders, exported as users export them, with the
greedy tokens of Hugging Face transformers as the reference.

Each decoder is a ``LlamaForCausalLM`` with fixed-seed random weights and a byte-level
BPE tokenizer trained on a few sentences (bos ``<s>``, eos ``</s>``, a chat template),
exported by optimum as ``optimum-cli export onnx --task text-generation-with-past``
does: the folder holds ``model.onnx`` (``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.N.key/value`` -> ``logits``,
``present.N.key/value``), ``config.json``, ``generation_config.json`` and the tokenizer
files. Weights are drawn with ``initializer_range`` 0.1: at the default 0.02 greedy
decoding of a random Llama repeats one token, which would not test a KV cache.

Beside each folder, ``NAME.json`` holds transformers' ``generate(do_sample=False,
max_new_tokens=16)`` tokens for prompts of 1 to 100 tokens, and the smallest gap between
the two largest logits over those steps (how far a float32 difference is from flipping
an argmax). The tests in ``tests/generation/test_generation_reference.py`` compare aioinfer's
tokens with them on every device.

``--bench`` makes instead the 58M-parameter decoder of ``benchmarks/generation.py``
(8 layers, hidden 512, vocabulary 32,000, 8 heads over 4 KV heads), exported to ONNX
(``DIR/onnx``) and to OpenVINO IR in fp32 (``DIR/openvino``, with ``optimum-cli export
openvino``) for the OpenVINO GenAI anchor. It is not committed: about 240 MB a copy.

Needs torch, transformers, tokenizers and optimum (not aioinfer's dependencies); the
set of ``benchmarks/generation.py``'s docstring installs together::

    python scripts/make_decoder.py                 # tests/data/decoders/
    python scripts/make_decoder.py --out DIR
    python scripts/make_decoder.py --bench --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 20261207
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "decoders"
MAX_NEW_TOKENS = 16
TASK = ("--task", "text-generation-with-past")

TOKENIZER_VOCAB = 320
"""The 256 byte symbols, 3 special tokens and 61 merges."""
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "An asyncio runtime serves many generations at once, one step for all of them.",
    "Every sequence keeps its own cache of keys and values, and leaves when it is done.",
    "Tokens stream to the client as soon as the decoder produces them.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Small models make fast tests; random weights make varied tokens.",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: "
    "{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
TEXT_PROMPTS = [
    "Hello",
    "The quick brown fox",
    "An asyncio runtime serves many generations at once.",
    "Every sequence keeps its own cache of keys and values, and leaves when it is done; "
    "tokens stream to the client as soon as the decoder produces them.",
]
RANDOM_PROMPT_LENGTHS = (1, 100)
"""Prompts of random token ids, besides the text prompts (bos alone is one of them)."""


@dataclass(frozen=True)
class Decoder:
    """The shape of one decoder."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int | None
    """None: the tokenizer's size."""
    max_positions: int


DECODERS = {
    "llama_gqa": Decoder(2, 64, 4, 2, 128, None, 256),
    "llama_mha": Decoder(2, 64, 4, 4, 128, None, 256),
}
BENCH = Decoder(8, 512, 8, 4, 1536, 32000, 2048)


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on :data:`CORPUS` that prepends ``<s>``."""
    model = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(CORPUS, trainer)
    model.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=model,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )


def make_model(shape: Decoder, vocab: int) -> LlamaForCausalLM:
    """A Llama decoder of ``shape`` with weights drawn from :data:`SEED`."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        initializer_range=0.1,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config).eval()


def save_source(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """The model as a Hugging Face folder, the input of optimum's exporters."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def optimum_cli(*arguments: str) -> None:
    """Run ``optimum-cli`` of this Python environment."""
    command = [sys.executable, "-m", "optimum.commands.optimum_cli", *arguments]
    subprocess.run(command, check=True)


def prompts(tokenizer: PreTrainedTokenizerFast, vocab: int) -> list[tuple[str | None, list[int]]]:
    """(text or None, token ids): the text prompts, then random ids after ``<s>``."""
    cases: list[tuple[str | None, list[int]]] = [
        (text, tokenizer(text)["input_ids"]) for text in TEXT_PROMPTS
    ]
    generator = torch.Generator().manual_seed(SEED)
    for length in RANDOM_PROMPT_LENGTHS:
        ids = torch.randint(3, vocab, (length - 1,), generator=generator).tolist()
        cases.append((None, [1, *ids]))
    return sorted(cases, key=lambda case: len(case[1]))


@torch.no_grad()
def reference(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, name: str
) -> dict[str, object]:
    """transformers' greedy tokens for :func:`prompts`, as written to ``NAME.json``."""
    cases = []
    for text, ids in prompts(tokenizer, model.config.vocab_size):
        input_ids = torch.tensor([ids])
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=MAX_NEW_TOKENS,
            pad_token_id=model.config.eos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        generated = out.sequences[0, len(ids) :].tolist()
        top2 = torch.stack(out.logits)[:, 0].topk(2, dim=-1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        case: dict[str, object] = {"input_ids": ids, "output_ids": generated}
        if text is not None:
            case["text"] = text
        case["min_logit_gap"] = round(gap, 6)
        cases.append(case)
    return {
        "model": name,
        "made_with": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "generate": {"do_sample": False, "max_new_tokens": MAX_NEW_TOKENS},
        "eos_token_id": [model.config.eos_token_id],
        "cases": cases,
    }


def make_test_decoders(out: Path) -> None:
    """Write each decoder of :data:`DECODERS` to ``out/NAME/`` and its reference tokens
    to ``out/NAME.json``."""
    tokenizer = make_tokenizer()
    for name, shape in DECODERS.items():
        model = make_model(shape, shape.vocab or len(tokenizer))
        with tempfile.TemporaryDirectory() as source:
            save_source(model, tokenizer, Path(source))
            optimum_cli("export", "onnx", "--model", source, *TASK, str(out / name))
        record = reference(model, tokenizer, name)
        (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters -> {out / name}")


def make_bench_decoder(out: Path) -> None:
    """Write :data:`BENCH` to ``out/onnx`` and, in fp32, to ``out/openvino``."""
    tokenizer = make_tokenizer()
    model = make_model(BENCH, BENCH.vocab or len(tokenizer))
    with tempfile.TemporaryDirectory() as source:
        save_source(model, tokenizer, Path(source))
        optimum_cli("export", "onnx", "--model", source, *TASK, str(out / "onnx"))
        optimum_cli(
            "export",
            "openvino",
            "--model",
            source,
            *TASK,
            "--weight-format",
            "fp32",
            str(out / "openvino"),
        )
    print(f"bench decoder: {sum(p.numel() for p in model.parameters())} parameters -> {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument(
        "--bench", action="store_true", help="the 58M-parameter decoder of the benchmark"
    )
    args = parser.parse_args()
    if args.bench:
        if args.out is None:
            parser.error("--bench needs --out (the decoder is not committed)")
        make_bench_decoder(args.out)
    else:
        make_test_decoders(args.out or DEFAULT_OUT)


if __name__ == "__main__":
    main()
