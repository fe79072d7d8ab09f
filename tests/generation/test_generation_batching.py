"""Concurrent generations on one compiled decoder: one batched step for all of them.

Every sequence's tokens are compared with the same sequence generated alone by a loop
written out by hand on onnxruntime (``tests.helpers.reference_generation``), whatever
arrives, leaves, waits or pauses beside it. Arrivals are staggered by the scheduler's
step count, not by time, so the interleaving is the same on a busy machine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import onnx
import pytest

import aioinfer as ai
from aioinfer.generation import GenerationConfig, GenerationScheduler, scheduler_of
from aioinfer.generation.cache import Block, attention_mask, repack, sequence_axes
from tests.helpers import decoder_model, hf_decoder, reference_generation

pytestmark = pytest.mark.anyio

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11], [12], [3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1]]
LENGTHS = [12, 5, 20, 9, 14, 7]


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return decoder_model()


@pytest.fixture(scope="module")
def expected(model: onnx.ModelProto) -> list[list[int]]:
    return [reference_generation(model, p, n)[0] for p, n in zip(PROMPTS, LENGTHS)]


async def collect(tokens: AsyncGenerator[int, None]) -> list[int]:
    return [token async for token in tokens]


def scheduler(compiled: ai.CompiledModel, config: Any = None) -> GenerationScheduler:
    found = scheduler_of(compiled, GenerationConfig.for_model(compiled, config))
    assert found is not None
    return found


async def until(condition: Any, what: str) -> None:
    with anyio.fail_after(30):
        while not condition():
            await anyio.sleep(0.001)


# -- greedy equality --------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["CPU", "ORT", "OPENVINO", "PROCESS:CPU", "AUTO"])
async def test_batched_greedy_tokens_equal_each_sequence_generated_alone(
    model: onnx.ModelProto, expected: list[list[int]], device: str
) -> None:
    compiled = await ai.Core().compile_model_async(model, device, {"STATEFUL": "auto"})
    try:
        batcher = scheduler(compiled)
        results: dict[int, list[int]] = {}

        async def run(index: int) -> None:
            tokens = ai.generate(compiled, PROMPTS[index], max_new_tokens=LENGTHS[index])
            results[index] = await collect(tokens)

        async with anyio.create_task_group() as group:
            for index in range(len(PROMPTS)):
                # Staggered: each arrives two decode steps after the one before, so
                # sequences join a running batch of other lengths, and leave it at
                # different steps.
                steps = batcher.counts().steps
                group.start_soon(run, index)
                await until(lambda s=steps: batcher.counts().steps >= s + 2, "two steps")
        assert [results[i] for i in range(len(PROMPTS))] == expected
        counts = batcher.counts()
        assert counts.running == counts.waiting == 0
        assert counts.generated_tokens == sum(LENGTHS)
        assert counts.prompt_tokens == sum(map(len, PROMPTS))
        # Batched: far fewer decode steps than tokens (each prompt's first token comes
        # from its prefill, the others from shared steps).
        assert counts.steps < sum(LENGTHS) - len(PROMPTS)
    finally:
        await compiled.close()


@pytest.mark.parametrize("device", ["CPU", "ORT", "OPENVINO"])
@pytest.mark.parametrize("name", ["llama_gqa", "llama_mha"])
async def test_batched_greedy_tokens_of_optimum_llama_exports_equal_transformers(
    name: str, device: str
) -> None:
    # Prompts of 1 to 100 tokens, arriving a few milliseconds apart: prefilled together
    # left-padded, then decoded in one batch whose rows have different lengths.
    folder, cases, eos = hf_decoder(name)
    compiled = await ai.Core().compile_model_async(
        folder / "model.onnx", device, {"STATEFUL": "auto"}
    )
    config = {"eos_token_id": list(eos), "max_step_tokens": 256}
    results: dict[int, list[int]] = {}

    async def run(index: int) -> None:
        tokens = ai.generate(compiled, cases[index].input_ids, max_new_tokens=16, config=config)
        results[index] = await collect(tokens)

    async with anyio.create_task_group() as group:
        for index in range(len(cases)):
            group.start_soon(run, index)
            await anyio.sleep(0.002)
    assert [results[i] for i in range(len(cases))] == [case.output_ids for case in cases]
    counts = scheduler(compiled, config).counts()
    assert counts.steps < 16 * len(cases) / 2  # batched
    await compiled.close()


async def test_prompts_longer_than_the_step_budget_are_prefilled_in_chunks(
    model: onnx.ModelProto, expected: list[list[int]]
) -> None:
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    config = {"max_step_tokens": 4}  # the 6- and 7-token prompts take two or more chunks
    results = {}

    async def run(index: int) -> None:
        tokens = ai.generate(compiled, PROMPTS[index], max_new_tokens=LENGTHS[index], config=config)
        results[index] = await collect(tokens)

    async with anyio.create_task_group() as group:
        for index in range(len(PROMPTS)):
            group.start_soon(run, index)
    assert [results[i] for i in range(len(PROMPTS))] == expected
    await compiled.close()


# -- consumers that go away or fall behind ------------------------------------------------------


@pytest.mark.parametrize("how", ["closed", "cancelled"])
async def test_a_consumer_that_goes_away_frees_its_place_for_a_waiting_sequence(
    model: onnx.ModelProto, expected: list[list[int]], how: str
) -> None:
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    config = {"max_running_sequences": 2}
    batcher = scheduler(compiled, config)
    first = ai.generate(compiled, PROMPTS[0], max_new_tokens=LENGTHS[0], config=config)
    leaving = ai.generate(compiled, PROMPTS[1], max_new_tokens=40, config=config)
    later: list[int] = []

    async def wait_then_run() -> None:
        tokens = ai.generate(compiled, PROMPTS[2], max_new_tokens=LENGTHS[2], config=config)
        later.extend(await collect(tokens))

    consumer = anyio.CancelScope()

    async def read_until_cancelled() -> None:
        with consumer:
            await collect(leaving)

    got_first = [await anext(first)]
    async with anyio.create_task_group() as group:
        if how == "cancelled":
            group.start_soon(read_until_cancelled)
        else:
            assert await anext(leaving) == reference_generation(model, PROMPTS[1], 1)[0][0]
        group.start_soon(wait_then_run)
        await until(lambda: batcher.counts().waiting == 1, "the third waits")
        assert batcher.counts().running == 2 and later == []
        if how == "cancelled":
            consumer.cancel()
        else:
            await leaving.aclose()
        got_first += await collect(first)
    assert got_first == expected[0]  # unchanged by the one that left
    assert later == expected[2]  # started in the freed place
    counts = batcher.counts()
    assert counts.running == counts.waiting == 0
    # The one that left stopped early: far fewer tokens than its 40 were generated.
    assert counts.generated_tokens < LENGTHS[0] + LENGTHS[2] + 40 - 10
    await compiled.close()


async def test_a_slow_consumer_pauses_its_sequence_and_never_holds_the_others_back(
    model: onnx.ModelProto, expected: list[list[int]]
) -> None:
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    config = {"max_buffered_tokens": 4}
    batcher = scheduler(compiled, config)
    slow = ai.generate(compiled, PROMPTS[2], max_new_tokens=LENGTHS[2], config=config)
    fast = ai.generate(compiled, PROMPTS[4], max_new_tokens=LENGTHS[4], config=config)
    slow_tokens = [await anext(slow)]
    # The fast consumer reads every token while the slow one reads none: the slow
    # sequence pauses with a full buffer, keeping its cache.
    fast_tokens = await collect(fast)
    assert fast_tokens == expected[4]
    assert batcher.counts().paused == 1 and batcher.counts().running == 1
    slow_tokens += await collect(slow)  # it resumes where it paused
    assert slow_tokens == expected[2]
    assert batcher.counts().running == 0
    await compiled.close()


# -- sampling -----------------------------------------------------------------------------------


async def test_a_seeded_sequence_samples_the_same_tokens_whatever_runs_beside_it(
    model: onnx.ModelProto,
) -> None:
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    options: dict[str, Any] = {"max_new_tokens": 16, "temperature": 3.0, "top_k": 8, "seed": 7}
    alone = await collect(ai.generate(compiled, PROMPTS[0], **options))
    request = compiled.create_infer_request()
    assert await collect(ai.generate(compiled, PROMPTS[0], request=request, **options)) == alone
    results: dict[str, list[int]] = {}

    async def run(name: str, prompt: list[int], settings: dict[str, Any]) -> None:
        results[name] = await collect(ai.generate(compiled, prompt, **settings))

    async with anyio.create_task_group() as group:
        group.start_soon(run, "other seed", PROMPTS[0], {**options, "seed": 8})
        group.start_soon(run, "greedy", PROMPTS[1], {"max_new_tokens": 10})
        await anyio.sleep(0.01)
        group.start_soon(run, "this", PROMPTS[0], options)
        top_p = {"max_new_tokens": 12, "temperature": 2.0, "top_p": 0.5}
        group.start_soon(run, "top_p", PROMPTS[3], top_p)
    assert results["this"] == alone
    assert results["other seed"] != alone
    assert results["greedy"] == reference_generation(model, PROMPTS[1], 10)[0]
    await compiled.close()


# -- limits -------------------------------------------------------------------------------------


async def test_beyond_the_waiting_limit_a_generation_gets_queue_full_error(
    model: onnx.ModelProto, expected: list[list[int]]
) -> None:
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    config = {"max_running_sequences": 1, "max_waiting_sequences": 1}
    batcher = scheduler(compiled, config)
    running = ai.generate(compiled, PROMPTS[0], max_new_tokens=LENGTHS[0], config=config)
    head = await anext(running)
    waiting = ai.generate(compiled, PROMPTS[2], max_new_tokens=LENGTHS[2], config=config)
    results: list[list[int]] = []
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: _append(results, collect(waiting)))
        await until(lambda: batcher.counts().waiting == 1, "the second waits")
        refused = ai.generate(compiled, PROMPTS[3], config=config)
        with pytest.raises(ai.QueueFullError) as raised:
            await anext(refused)
        assert str(raised.value) == (
            f"model {compiled.name!r}: 1 sequences run and 1 wait, the most it takes "
            "(max_running_sequences 1, max_waiting_sequences 1); retry later"
        )
        assert [head, *await collect(running)] == expected[0]
    assert results == [expected[2]]
    # Places free again: a retry is served.
    tokens = ai.generate(compiled, PROMPTS[3], max_new_tokens=LENGTHS[3], config=config)
    assert await collect(tokens) == expected[3]
    await compiled.close()


async def _append(results: list[list[int]], tokens: Any) -> None:
    results.append(await tokens)


def test_limits_are_generate_keys_checked_by_name() -> None:
    config = GenerationConfig.from_mapping(
        {"max_running_sequences": 8, "max_step_tokens": 256, "batching": False}
    )
    assert (config.max_running_sequences, config.max_step_tokens, config.batching) == (
        8,
        256,
        False,
    )
    with pytest.raises(ai.GenerationError, match="'max_step_tokens' must be an integer at least 1"):
        GenerationConfig.from_mapping({"max_step_tokens": 0})
    with pytest.raises(ai.GenerationError, match="'batching' must be true or false, got 'no'"):
        GenerationConfig.from_mapping({"batching": "no"})


# -- the event loop -----------------------------------------------------------------------------


async def test_the_event_loop_stays_responsive_while_batches_run() -> None:
    model = decoder_model(slow=400)
    compiled = ai.Core().compile_model(model, "CPU", {"STATEFUL": "auto"})
    # The control: one step of this model on a request, as the scheduler runs it.
    request = compiled.create_infer_request()
    inputs = {
        "input_ids": np.array([[1] * 8], np.int64),
        "attention_mask": np.ones((1, 8), np.int64),
        "position_ids": np.arange(8)[None],
    }
    started = time.perf_counter()
    for _ in range(3):
        request.reset_state()
        await request.infer(inputs)
    step = (time.perf_counter() - started) / 3
    gaps: list[float] = []
    done = anyio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def run(prompt: list[int]) -> None:
        await collect(ai.generate(compiled, prompt, max_new_tokens=10))

    async with anyio.create_task_group() as group:
        group.start_soon(tick)
        async with anyio.create_task_group() as generations:
            for prompt in PROMPTS:
                generations.start_soon(run, prompt)
        done.set()
    # Steps ran off the loop: the loop came back far more often than a step lasts.
    assert len(gaps) > 20
    assert float(np.median(gaps)) < step / 4
    await compiled.close()


# -- the cache layout ---------------------------------------------------------------------------


def test_repack_right_aligns_rows_and_trims_unused_columns() -> None:
    # Two batches of [rows, heads 1, sequence, 2]; row lengths 3, 1 | 2.
    first = np.arange(2 * 4 * 2, dtype=np.float32).reshape(2, 1, 4, 2) + 1
    first[1, :, :3] = 0  # row 1 has one position, right-aligned
    first[0, :, :1] = 0  # row 0 has three
    second = np.full((1, 1, 2, 2), -1.0, np.float32)
    packed = repack([2], [Block([first], [1, 0]), Block([second], [0])], 3)[0]
    assert packed.shape == (3, 1, 3, 2)
    np.testing.assert_array_equal(packed[0], first[1, :, 1:])
    np.testing.assert_array_equal(packed[1], first[0, :, 1:])
    np.testing.assert_array_equal(packed[2, :, 1:], second[0])
    np.testing.assert_array_equal(packed[2, :, 0], 0)
    # All rows of one block at its width: the same arrays, no copy.
    assert repack([2], [Block([first], [0, 1])], 4)[0] is first
    assert attention_mask([3, 1], 4, np.dtype(np.int64)).tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert sequence_axes([np.zeros((0, 4, 0, 8)), np.zeros((0, 0, 8))]) == [2, 1]
    assert sequence_axes([np.zeros((0, 4, 8))]) is None  # no sequence axis
