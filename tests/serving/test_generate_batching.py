"""Served generations go through the model's generation scheduler: batched, limited by the
``generate`` key of config.json, counted in the Prometheus metrics under vLLM's names."""

from __future__ import annotations

from pathlib import Path

import pytest

import aioinfer as ai
from aioinfer.errors import ErrorKind, ServiceError
from aioinfer.generation import schedulers_of
from aioinfer.serving.generation import GenerateRequest
from aioinfer.serving.repository import ModelRepository
from aioinfer.serving.service import InferenceService
from tests.helpers import decoder_model, reference_generation
from tests.serving.conftest import write_config, write_model

pytestmark = pytest.mark.anyio

PROMPTS = [[1, 2, 3], [4, 5]]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    write_model(tmp_path, "decoder", 1, decoder_model())
    generate = {"max_new_tokens": 6, "max_running_sequences": 2, "max_waiting_sequences": 0}
    config = {"stateful": "auto", "generate": generate, "max_concurrency": 8}
    write_config(tmp_path, "decoder", config)
    return tmp_path


async def test_served_generations_batch_within_the_config_limits_and_are_counted(
    repository: Path,
) -> None:
    service = InferenceService(ModelRepository(repository))
    expected = [reference_generation(decoder_model(), p, 6)[0] for p in PROMPTS]
    async with service.lifespan():
        streams = [service.generate("decoder", None, GenerateRequest(p)) for p in PROMPTS]
        firsts = [(await anext(s)).token_id for s in streams]
        # Two run (max_running_sequences), none may wait: the third is refused, retryable.
        refused = service.generate("decoder", None, GenerateRequest([1]))
        with pytest.raises(ServiceError) as raised:
            await anext(refused)
        assert raised.value.kind is ErrorKind.UNAVAILABLE
        assert "max_running_sequences 2, max_waiting_sequences 0); retry later" in str(raised.value)
        rests: list[list[int]] = []
        for stream in streams:
            rests.append([token.token_id async for token in stream])
        assert [[f, *r] for f, r in zip(firsts, rests)] == expected
        (scheduler,) = schedulers_of(service.find("decoder", None).compiled)
        steps = scheduler.counts().steps
        assert steps < 10  # 5 decode steps each: both sequences in most steps
        text = service.metrics.render().decode()
    labels = '{model="decoder",version="1"}'
    for line in (
        f"aioinfer:num_requests_running{labels} 0.0",
        f"aioinfer:num_requests_waiting{labels} 0.0",
        f"aioinfer:prompt_tokens_total{labels} 5.0",
        f"aioinfer:generation_tokens_total{labels} 12.0",
        f"aioinfer:time_to_first_token_seconds_count{labels} 2.0",
        f"aioinfer:inter_token_latency_seconds_count{labels} 10.0",
        f"aioinfer:e2e_request_latency_seconds_count{labels} 2.0",
        f"aioinfer:request_queue_time_seconds_count{labels} 2.0",
        f"aioinfer:batch_size_count{labels} {float(steps)}",
        f"aioinfer:batch_size_sum{labels} 10.0",
    ):
        assert line in text, line
    assert ai.QueueFullError.__name__ in type(raised.value.__cause__).__name__
