"""aioinfer.generate: tokens of a decoder with its KV cache in the request.

Every token is compared with a greedy (or sampling) loop written out by hand on
onnxruntime, which feeds the KV cache back explicitly (``tests.helpers.
reference_generation``): token ids compare exactly (the logits of the tiny decoder are
far apart, so float32 differences between the two runtimes never flip an argmax).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import onnx
import pytest

import aioinfer as ai
from aioinfer.generation import GenerationConfig, Sampling
from tests.helpers import decoder_model, reference_generation

pytestmark = pytest.mark.anyio

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return decoder_model()


@pytest.fixture(scope="module")
def compiled(model: onnx.ModelProto) -> ai.CompiledModel:
    return ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})


async def collect(tokens: AsyncGenerator[int, None]) -> list[int]:
    return [token async for token in tokens]


# -- greedy ---------------------------------------------------------------------------------


async def test_greedy_tokens_equal_a_hand_written_loop_with_explicit_kv_inputs(
    compiled: ai.CompiledModel, model: onnx.ModelProto
) -> None:
    assert compiled.get_property("STATEFUL") == {
        "past_key": "present_key",
        "past_value": "present_value",
    }
    expected, _ = reference_generation(model, PROMPT, 12)
    assert len(set(expected)) > 3  # a sequence that says something
    assert await collect(ai.generate(compiled, PROMPT, max_new_tokens=12)) == expected
    # A [1, n] array prompt, int32 ids: the same.
    prompt = np.array([PROMPT], np.int32)
    assert await collect(ai.generate(compiled, prompt, max_new_tokens=12)) == expected
    # The state is reset for every call: the second call is not a continuation.
    assert await collect(ai.generate(compiled, PROMPT, max_new_tokens=12)) == expected


@pytest.mark.parametrize("device", ["ORT", "PROCESS:CPU"])
async def test_greedy_tokens_are_the_same_on_devices_that_keep_state_above_them(
    model: onnx.ModelProto, device: str
) -> None:
    expected, _ = reference_generation(model, PROMPT, 8)
    compiled = await ai.Core().compile_model_async(model, device, {"STATEFUL": "auto"})
    try:
        assert await collect(ai.generate(compiled, PROMPT, max_new_tokens=8)) == expected
    finally:
        await compiled.close()


async def test_mask_and_positions_are_optional_and_a_model_without_state_gets_the_sequence(
    model: onnx.ModelProto,
) -> None:
    core = ai.Core()
    bare = decoder_model(attention_mask=False, position_ids=False)
    expected, _ = reference_generation(bare, PROMPT, 10)
    compiled = core.compile_model(bare, "CPU", {"STATEFUL": "auto"})
    assert [p.name for p in compiled.inputs] == ["input_ids"]
    assert await collect(ai.generate(compiled, PROMPT, max_new_tokens=10)) == expected
    # Without a cache the whole sequence goes in at each step: the same tokens as the
    # cached model (the attention is causal), and as the loop by hand.
    stateless = decoder_model(cache=False)
    expected, _ = reference_generation(stateless, PROMPT, 10)
    assert expected == reference_generation(model, PROMPT, 10)[0]
    compiled = core.compile_model(stateless, "CPU")
    assert await collect(ai.generate(compiled, PROMPT, max_new_tokens=10)) == expected


async def test_a_wrong_mask_length_would_fail_the_model(compiled: ai.CompiledModel) -> None:
    # The control for "the loop maintains attention_mask": the model checks its length.
    request = compiled.create_infer_request()
    inputs = {
        "input_ids": np.array([PROMPT], np.int64),
        "attention_mask": np.ones((1, 2), np.int64),
        "position_ids": np.arange(3)[None],
    }
    with pytest.raises(ai.InferenceError):
        await request.infer(inputs)


# -- sampling -------------------------------------------------------------------------------


async def test_sampling_is_reproducible_with_a_seed_and_differs_with_another(
    compiled: ai.CompiledModel,
) -> None:
    def run(seed: int) -> AsyncGenerator[int, None]:
        return ai.generate(compiled, PROMPT, max_new_tokens=16, temperature=3.0, seed=seed)

    first = await collect(run(7))
    assert await collect(run(7)) == first
    assert await collect(run(8)) != first
    greedy = await collect(ai.generate(compiled, PROMPT, max_new_tokens=16))
    assert first != greedy
    # One candidate left: sampling is greedy, whatever the temperature and seed.
    for cut in ({"top_k": 1}, {"top_p": 1e-6}):
        tokens = ai.generate(compiled, PROMPT, max_new_tokens=16, temperature=3.0, seed=1, **cut)
        assert await collect(tokens) == greedy


async def test_sampled_tokens_are_among_the_top_k_of_the_reference_logits(
    compiled: ai.CompiledModel, model: onnx.ModelProto
) -> None:
    tokens = await collect(
        ai.generate(compiled, PROMPT, max_new_tokens=20, temperature=5.0, top_k=3, seed=11)
    )
    replay = iter(tokens)
    _, logits = reference_generation(model, PROMPT, len(tokens), pick=lambda _: next(replay))
    for token, step in zip(tokens, logits):
        assert token in np.argsort(step)[-3:]
    assert len(set(tokens)) > 2


def test_sampling_draws_from_the_tempered_softmax_within_top_p() -> None:
    # The sampler alone, against numpy: frequencies of 20000 draws within 0.015.
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0], np.float32)
    sampling = Sampling(max_new_tokens=1, temperature=0.5, top_p=0.9)
    rng = np.random.default_rng(0)
    draws = np.bincount([sampling.pick(logits, rng) for _ in range(20000)], minlength=5) / 20000
    p = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    kept = np.argsort(-p)[: int(np.searchsorted(np.cumsum(np.sort(p)[::-1]), 0.9)) + 1]
    expected = np.zeros(5)
    expected[kept] = p[kept] / p[kept].sum()
    np.testing.assert_allclose(draws, expected, atol=0.015)
    assert draws[3] == 0 and draws[4] == 0  # outside the nucleus


# -- stopping ---------------------------------------------------------------------------------


async def test_eos_and_stop_tokens_end_the_generation_after_yielding_them(
    compiled: ai.CompiledModel, model: onnx.ModelProto
) -> None:
    expected, _ = reference_generation(model, PROMPT, 12)
    stop = expected[3]
    cut = expected[: expected.index(stop) + 1]
    assert await collect(ai.generate(compiled, PROMPT, max_new_tokens=12, stop=[stop])) == cut
    config = {"eos_token_id": stop, "max_new_tokens": 12}
    assert await collect(ai.generate(compiled, PROMPT, config=config)) == cut
    # The config's max_new_tokens is the default length.
    assert (
        await collect(ai.generate(compiled, PROMPT, config={"max_new_tokens": 5})) == expected[:5]
    )


# -- cancellation and requests ------------------------------------------------------------------


async def test_closing_the_generator_stops_compute_and_leaves_the_request_usable(
    compiled: ai.CompiledModel, model: onnx.ModelProto
) -> None:
    request = compiled.create_infer_request()
    completed: list[bool] = []
    request.set_callback(lambda r, _: completed.append(r.error is None))
    tokens = ai.generate(compiled, PROMPT, max_new_tokens=50, request=request)
    got = [await anext(tokens) for _ in range(3)]
    await tokens.aclose()
    assert completed == [True, True, True]  # one step per token asked for, no more
    for _ in range(5):
        await anyio.lowlevel.checkpoint()
    assert len(completed) == 3
    assert request.state is ai.RequestState.IDLE
    expected, _ = reference_generation(model, PROMPT, 6)
    assert got == expected[:3]
    # The same request generates again, from a reset state.
    assert (
        await collect(ai.generate(compiled, PROMPT, max_new_tokens=6, request=request)) == expected
    )


async def test_cancelling_the_consumer_cancels_the_running_step() -> None:
    model = decoder_model(slow=1500)
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    request = compiled.create_infer_request()
    outcomes: list[Any] = []
    request.set_callback(lambda r, _: outcomes.append(r.error))
    tokens = ai.generate(compiled, PROMPT, max_new_tokens=50, request=request)
    first = await anext(tokens)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(anext, tokens)
            while request.state is not ai.RequestState.BUSY:
                await anyio.sleep(0.001)
            scope.cancel()
    assert scope.cancelled_caught
    # The second step was stopped before it completed; nothing runs any more.
    assert len(outcomes) == 2 and outcomes[0] is None
    assert isinstance(outcomes[1], ai.InferCancelledError)
    assert request.state is ai.RequestState.IDLE
    with pytest.raises(StopAsyncIteration):
        await anext(tokens)  # the generator ended with the cancellation
    expected, _ = reference_generation(model, PROMPT, 2)
    assert first == expected[0]
    assert (
        await collect(ai.generate(compiled, PROMPT, max_new_tokens=2, request=request)) == expected
    )
    await compiled.close()


async def test_without_batching_generations_use_separate_requests_and_queue_beyond_the_pool(
    model: onnx.ModelProto,
) -> None:
    compiled = ai.Core().compile_model(
        model, "CPU", {"STATEFUL": "auto", "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2}
    )
    size = compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
    assert size == 4
    prompts = [[1 + i, 2, 3 + i] for i in range(size + 1)]
    expected = [reference_generation(model, p, 6)[0] for p in prompts]
    alone = {"batching": False}
    generators = [ai.generate(compiled, p, max_new_tokens=6, config=alone) for p in prompts]
    firsts = [await anext(g) for g in generators[:size]]  # each holds a request now
    waiting: list[int] = []

    async def wait_for_a_request() -> None:
        waiting.append(await anext(generators[-1]))

    async with anyio.create_task_group() as group:
        group.start_soon(wait_for_a_request)
        for _ in range(50):
            await anyio.lowlevel.checkpoint()
        await anyio.sleep(0.05)
        assert waiting == []  # every request of the pool is taken: it waits
        # Interleaved steps of the others do not mix their caches.
        rest = [[await anext(g) for _ in range(5)] for g in generators[:size]]
        for g in generators[:2]:
            with pytest.raises(StopAsyncIteration):
                await anext(g)  # a finished generation hands its request on
    assert [[f, *r] for f, r in zip(firsts, rest)] == expected[:size]
    assert waiting == expected[-1][:1]
    assert [*waiting, *await collect(generators[-1])] == expected[-1]
    for g in generators:
        await g.aclose()
    await compiled.close()


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "error", "message"),
    [
        ([1.5, 2.0], ai.InputTypeError, "token ids must be integers, got float64"),
        ([], ai.InputShapeError, "expected one non-empty sequence of token ids, got shape [0]"),
        ([[1, 2], [3, 4]], ai.InputShapeError, "got shape [2, 2]"),
        ([1, 16], ai.InputShapeError, "token id 16 is out of range [0, 16)"),
        ([-1, 2], ai.InputShapeError, "token id -1 is out of range [0, 16)"),
    ],
)
async def test_bad_input_ids_are_refused_before_anything_runs(
    compiled: ai.CompiledModel, prompt: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=r"input 'input_ids': ") as raised:
        await anext(ai.generate(compiled, prompt))
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": -1.0}, "temperature must be finite and at least 0, got -1.0"),
        ({"top_p": 0.0}, "top_p must be a number in (0, 1], got 0.0"),
        ({"top_k": -2}, "top_k must be an integer at least 0, got -2"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer at least 1, got 0"),
        ({"seed": -3}, "seed must be an integer at least 0, got -3"),
        ({"stop": ["."]}, "stop must be a token id or a list of them"),
        ({"config": {"input_ids": "tokens"}}, "generate 'input_ids' names 'tokens', not an input"),
        ({"config": {"logits": "scores"}}, "generate 'logits' names 'scores', not an output"),
        ({"config": {"eos": 0}}, "unknown generate key 'eos'; known keys: input_ids"),
        ({"config": {"position_ids": "input_ids", "attention_mask": None}}, "'attention_mask'"),
    ],
)
async def test_bad_settings_raise_generation_error(
    compiled: ai.CompiledModel, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ai.GenerationError) as raised:
        await anext(ai.generate(compiled, PROMPT, **options))
    assert message in str(raised.value)


async def test_a_decoder_compiled_without_stateful_is_refused_with_the_fix(
    model: onnx.ModelProto,
) -> None:
    compiled = ai.Core().compile_model(model, "CPU")
    with pytest.raises(
        ai.GenerationError, match="'past_key', 'past_value': compile it with STATEFUL"
    ):
        await anext(ai.generate(compiled, PROMPT))


def test_generation_config_from_mapping() -> None:
    config = GenerationConfig.from_mapping({"eos_token_id": [0, 2], "max_new_tokens": 8})
    assert config.eos_token_id == (0, 2) and config.max_new_tokens == 8
    assert GenerationConfig.from_mapping({"eos_token_id": 5}).eos_token_id == (5,)
    with pytest.raises(ai.GenerationError, match="'max_new_tokens' must be an integer at least 1"):
        GenerationConfig.from_mapping({"max_new_tokens": "8"})
    with pytest.raises(ai.GenerationError, match="'logits' must be a string, got 3"):
        GenerationConfig.from_mapping({"logits": 3})


async def test_leaving_early_with_aclosing_returns_the_request_to_the_pool(
    compiled: ai.CompiledModel,
) -> None:
    # The pool of this LATENCY model holds one request: a second generation gets it only
    # if the first one gave it back.
    assert compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 1
    alone = {"batching": False}
    async with contextlib.aclosing(
        ai.generate(compiled, PROMPT, max_new_tokens=9, config=alone)
    ) as tokens:
        async for _ in tokens:
            break
    with anyio.fail_after(30):
        tokens = ai.generate(compiled, PROMPT, max_new_tokens=3, config=alone)
        assert len(await collect(tokens)) == 3
