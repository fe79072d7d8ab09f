"""Batching by tokens: concurrent calls share batches grouped by length, results are
split back unchanged, a long text runs without the short ones, and a cancelled caller
leaves the others' texts to be run by them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import numpy as np
import pytest

import aioinfer
from aioinfer.pipelines.batching import TokenBatcher
from aioinfer.text import Encoding
from tests.pipelines.conftest import ST_EMBEDDER, cosines

pytestmark = pytest.mark.anyio


def encodings(*lengths: int) -> list[Encoding]:
    return [Encoding(np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)) for n in lengths]


async def test_concurrent_calls_share_batches_and_get_their_own_vectors(
    reference: dict[str, Any],
) -> None:
    texts = reference["embeddings"]["texts"]
    calls = [
        [texts[i % len(texts)], texts[(3 * i + 1) % len(texts)]][: 1 + i % 2] for i in range(24)
    ]
    batching = aioinfer.TokenBatching(batches_in_flight=1)
    async with await aioinfer.TextEmbedder.load(ST_EMBEDDER, "CPU", batching=batching) as embedder:
        alone = [await embedder.embed(call) for call in calls]
        before = embedder.statistics.batches  # one or two per call (lengths apart)
        assert before >= len(calls)
        together: list[np.ndarray | None] = [None] * len(calls)

        async def one(index: int) -> None:
            together[index] = await embedder.embed(calls[index])

        async with anyio.create_task_group() as tg:
            for index in range(len(calls)):
                tg.start_soon(one, index)
        batches = embedder.statistics.batches - before
    assert batches <= before / 2, f"{len(calls)} concurrent calls ran in {batches} batches"
    for expected, actual in zip(alone, together):
        assert actual is not None and actual.shape == expected.shape
        assert cosines(actual, expected).min() >= 0.9999
        np.testing.assert_allclose(actual, expected, atol=1e-5)
    stats = embedder.statistics
    assert stats.texts == 2 * sum(map(len, calls))
    assert stats.tokens <= stats.padded_tokens


async def test_batches_group_texts_by_length() -> None:
    batches: list[list[int]] = []
    gate = anyio.Event()

    async def compute(batch: Sequence[Encoding]) -> list[int]:
        batches.append([len(e) for e in batch])
        if len(batches) == 1:
            await gate.wait()  # the others queue meanwhile
        return [len(e) for e in batch]

    batcher = TokenBatcher(
        compute, aioinfer.TokenBatching(max_batch_tokens=200, batches_in_flight=1)
    )
    lengths = [4, 40] * 10 + [300]
    results: dict[int, list[int]] = {}

    async def call(index: int) -> None:
        results[index] = await batcher.run(encodings(lengths[index]))

    async with anyio.create_task_group() as tg:
        for index in range(len(lengths)):
            tg.start_soon(call, index)
        await anyio.wait_all_tasks_blocked()
        gate.set()
    assert results == {i: [n] for i, n in enumerate(lengths)}
    # After the first, every batch holds texts of one length: the 300-token text alone
    # (longer than the budget), the 40s five at a time (200 tokens), the 4s together.
    assert all(len(set(batch)) == 1 for batch in batches[1:]), batches
    assert [300] in batches
    assert all(len(b) * max(b) <= 200 for b in batches if max(b) <= 200)
    stats = batcher.statistics
    assert stats.texts == len(lengths) and stats.tokens == sum(lengths)
    assert stats.padded_tokens == sum(len(b) * max(b) for b in batches)
    assert stats.padded_tokens - stats.tokens <= 36  # only the first batch pads


async def test_cancelled_caller_hands_back_the_others_texts() -> None:
    batches: list[tuple[str, list[int]]] = []
    first_gate, merged_running = anyio.Event(), anyio.Event()

    async def compute(batch: Sequence[Encoding]) -> list[int]:
        batches.append((anyio.get_current_task().name, [len(e) for e in batch]))
        if len(batches) == 1:
            await first_gate.wait()
        elif len(batches) == 2:  # B's and C's texts together: hangs until cancelled
            merged_running.set()
            await anyio.sleep_forever()
        return [10 * len(e) for e in batch]

    batcher = TokenBatcher(compute, aioinfer.TokenBatching(batches_in_flight=1))
    scopes: dict[str, anyio.CancelScope] = {}
    results: dict[str, list[int]] = {}

    async def call(name: str, lengths: list[int]) -> None:
        with anyio.CancelScope() as scope:
            scopes[name] = scope
            results[name] = await batcher.run(encodings(*lengths))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "A", [3], name="A")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, "B", [5], name="B")
        tg.start_soon(call, "C", [6, 7], name="C")
        await anyio.wait_all_tasks_blocked()
        first_gate.set()
        await merged_running.wait()
        runner = batches[1][0]
        other = "C" if runner == "B" else "B"
        assert sorted(batches[1][1]) == [5, 6, 7]
        scopes[runner].cancel()
    assert runner not in results
    expected = {"A": [30], "B": [50], "C": [60, 70]}
    assert results == {"A": [30], other: expected[other]}
    # The cancelled caller's text never ran again; the other's ran once more, by it.
    assert [name for name, _ in batches[2:]] == [other]
    assert sorted(batches[2][1]) == sorted(n // 10 for n in expected[other])
    assert await batcher.run(encodings(2)) == [20]  # nothing left behind


async def test_cancelling_an_embed_call_leaves_concurrent_calls_right(
    reference: dict[str, Any],
) -> None:
    texts = reference["embeddings"]["texts"]
    batching = aioinfer.TokenBatching(batches_in_flight=1, max_batch_size=8)
    async with await aioinfer.TextEmbedder.load(ST_EMBEDDER, "CPU", batching=batching) as embedder:
        expected = await embedder.embed(texts)
        got: list[np.ndarray] = []

        async def others() -> None:
            for _ in range(5):
                got.append(await embedder.embed(texts))

        async def cancel_after_two_batches(scope: anyio.CancelScope) -> None:
            start = embedder.statistics.batches
            while embedder.statistics.batches < start + 2:
                await anyio.sleep(0.001)
            scope.cancel()

        async with anyio.create_task_group() as outer:
            outer.start_soon(others)
            with anyio.CancelScope() as big:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_after_two_batches, big)
                    await embedder.embed(texts * 200)
        assert big.cancelled_caught
        assert len(got) == 5
        for vectors in got:
            np.testing.assert_allclose(vectors, expected, atol=1e-5)
        np.testing.assert_allclose(await embedder.embed(texts), expected, atol=1e-5)


async def test_max_padding_keeps_texts_of_other_lengths_apart() -> None:
    batches: list[list[int]] = []
    gate = anyio.Event()

    async def compute(batch: Sequence[Encoding]) -> list[int]:
        batches.append(sorted(len(e) for e in batch))
        if len(batches) == 1:
            await gate.wait()
        return [0] * len(batch)

    batcher = TokenBatcher(compute, aioinfer.TokenBatching(batches_in_flight=1, max_padding=0.1))
    async with anyio.create_task_group() as tg:
        tg.start_soon(batcher.run, encodings(1))
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(batcher.run, encodings(10, 20, 12))
        await anyio.wait_all_tasks_blocked()
        gate.set()
    # 10 and 12 pad to 24 tokens for 22 (within 10%); 20 with them would be 60 for 42.
    assert batches == [[1], [10, 12], [20]]


@pytest.mark.parametrize(
    "setting", [{"max_batch_tokens": 0}, {"batches_in_flight": 1.5}, {"max_padding": -0.1}]
)
def test_batching_settings_are_checked(setting: dict[str, Any]) -> None:
    name = next(iter(setting))
    with pytest.raises(aioinfer.InvalidPropertyValueError, match=f"TokenBatching.{name}"):
        aioinfer.TokenBatching(**setting)


async def test_calls_are_served_in_arrival_order() -> None:
    """A call arriving while others wait does not take the next batch before them (each
    arrival wakes the waiting callers, and the newest used to run its own texts first)."""
    gate = anyio.Event()
    finished: list[int] = []

    async def compute(batch: Sequence[Encoding]) -> list[int]:
        await gate.wait()
        await anyio.sleep(0)  # as a device's inference, which always yields
        return [len(e) for e in batch]

    batcher = TokenBatcher(compute, aioinfer.TokenBatching(batches_in_flight=1))

    async def call(index: int, length: int) -> None:
        await batcher.run(encodings(length))
        finished.append(index)

    async with anyio.create_task_group() as tg:
        for index, length in enumerate([10, 40, 80, 160, 320]):  # lengths apart: one batch each
            tg.start_soon(call, index, length)
            await anyio.wait_all_tasks_blocked()
        gate.set()
    assert finished == [0, 1, 2, 3, 4]
    assert batcher.statistics.batches == 5
