"""Text generation in Python: TextGenerator and aioinfer.generate_text over optimum's
decoder folders (greedy text equal to transformers'), and generate_steps' penalties,
log-probabilities and ignore_eos."""

from __future__ import annotations

from contextlib import aclosing

import numpy as np
import pytest

import aioinfer as ai
from aioinfer.generation import generate_steps, scheduler_of
from aioinfer.text import TextGenerator
from tests.helpers import hf_decoder

pytestmark = pytest.mark.anyio
tokenizers = pytest.importorskip("tokenizers")

NAME = "llama_gqa"


@pytest.fixture(scope="module")
def compiled() -> ai.CompiledModel:
    folder, _, _ = hf_decoder(NAME)
    return ai.Core().compile_model(folder / "model.onnx", "CPU", {"STATEFUL": "auto"})


@pytest.fixture(scope="module")
def generator(compiled: ai.CompiledModel) -> TextGenerator:
    folder, _, _ = hf_decoder(NAME)
    return TextGenerator.from_folder(compiled, folder)


async def test_greedy_text_is_transformers_tokens_decoded(generator: TextGenerator) -> None:
    _, cases, eos = hf_decoder(NAME)
    assert generator.config.eos_token_id == eos  # from generation_config.json
    for case in cases:
        result = await generator.complete(case.input_ids, max_tokens=16, temperature=0)
        assert result.token_ids == case.output_ids
        assert result.text == generator.decode(case.output_ids)
        assert result.finish_reason == "length"


async def test_generate_text_streams_chunks_of_a_folder(compiled: ai.CompiledModel) -> None:
    folder, cases, _ = hf_decoder(NAME)
    case = cases[1]  # "Hello" with <s>
    chunks = [c async for c in ai.generate_text(compiled, folder, "Hello", max_tokens=16)]
    assert [step.token for c in chunks for step in c.steps] == case.output_ids
    assert [c.finish_reason for c in chunks][-1] == "length"
    assert all(c.finish_reason is None for c in chunks[:-1])
    messages = [{"role": "user", "content": "Hi"}]
    chat = [c async for c in ai.generate_text(compiled, folder, messages, max_tokens=4)]
    assert sum(len(c.steps) for c in chat) == 4


async def test_a_stop_string_ends_the_sequence_in_its_scheduler(
    generator: TextGenerator, compiled: ai.CompiledModel
) -> None:
    full = await generator.complete("Hello", max_tokens=16, temperature=0)
    stop = full.text[4:6]
    cut = await generator.complete("Hello", max_tokens=16, temperature=0, stop=stop)
    assert cut.text == full.text[: full.text.find(stop)]
    assert cut.finish_reason == "stop" and len(cut.steps) < 16
    scheduler = scheduler_of(compiled, generator.config)
    assert scheduler is not None and scheduler.counts().running == 0


async def test_penalties_logprobs_and_ignore_eos(compiled: ai.CompiledModel) -> None:
    _, cases, eos = hf_decoder(NAME)
    case = cases[2]  # transformers repeats token 72 five times
    config = {"eos_token_id": list(eos)}

    async def tokens(**options: object) -> list[ai.generation.Step]:
        steps = generate_steps(
            compiled, case.input_ids, max_new_tokens=16, config=config, **options
        )  # type: ignore[arg-type]
        async with aclosing(steps):
            return [step async for step in steps]

    plain = [s.token for s in await tokens()]
    assert plain == case.output_ids
    penalized = [s.token for s in await tokens(frequency_penalty=2.0)]
    assert max(np.bincount(penalized)) < max(np.bincount(plain))
    steps = await tokens(logprobs=3)
    assert [s.token for s in steps] == plain  # log-probabilities change nothing
    for step in steps:
        assert step.logprob is not None and step.logprob <= 0
        assert len(step.top_logprobs) == 3 and step.top_logprobs[0] == (step.token, step.logprob)
        values = [value for _, value in step.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert sum(np.exp(values)) <= 1 + 1e-9
    # A prompt whose greedy continuation is the end-of-sequence token at once.
    forced = {"eos_token_id": [plain[0]]}
    stopped = generate_steps(compiled, case.input_ids, max_new_tokens=5, config=forced)
    assert [s.token async for s in stopped] == plain[:1]
    going = generate_steps(
        compiled, case.input_ids, max_new_tokens=5, config=forced, ignore_eos=True
    )
    assert [s.token async for s in going] == plain[:5]


async def test_chat_without_a_template_is_refused(compiled: ai.CompiledModel) -> None:
    bare = TextGenerator(
        compiled, tokenizers.Tokenizer.from_file(str(hf_decoder(NAME)[0] / "tokenizer.json"))
    )
    with pytest.raises(ai.ChatTemplateError, match="no chat template"):
        await bare.complete([{"role": "user", "content": "Hi"}])
    with pytest.raises(ai.TextGenerationError, match="stop must be a string"):
        await bare.complete("Hi", stop=[3])


async def test_the_models_context_length_bounds_a_generation(generator: TextGenerator) -> None:
    """The folder's ``max_position_embeddings`` (256) bounds prompt plus generation: a
    request past it is refused naming both lengths, and without ``max_tokens`` the
    generation stops where the context ends instead of running past it."""
    assert generator.max_context == 256
    prompt = [5] * 250
    with pytest.raises(ai.TextGenerationError, match="maximum context length is 256"):
        await generator.complete(prompt, max_tokens=16, temperature=0)
    with pytest.raises(ai.TextGenerationError, match="no room"):
        await generator.complete([5] * 256, temperature=0)
    result = await generator.complete(prompt, temperature=0, ignore_eos=True)
    assert len(result.token_ids) == 6 and result.finish_reason == "length"
    fits = await generator.complete(prompt, max_tokens=6, temperature=0, ignore_eos=True)
    assert fits.token_ids == result.token_ids
