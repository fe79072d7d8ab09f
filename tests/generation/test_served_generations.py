"""A served decoder batches every generation its clients run at once: with no
``max_concurrency`` in its config, the server's admission lets each generation reach the
model's scheduler (a decoder compiled for latency takes one inference at a time); its
prefill projects the last position only, unless its config asks for every one."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import httpx

from aioinfer.generation import schedulers_of
from aioinfer.serving import create_app
from aioinfer.serving.repository import ModelConfig, ModelRepository
from aioinfer.serving.service import InferenceService
from tests.helpers import HF_DECODERS, decoder_model, hf_decoder, reference_generation, wait_until
from tests.serving.conftest import LiveServer, write_config, write_model

STREAMS = 6
PROMPTS = [[1 + i, 2, 3 + i] for i in range(STREAMS)]


def test_concurrent_generate_streams_all_run_in_one_batch(tmp_path: Path) -> None:
    model = decoder_model(slow=200)
    write_model(tmp_path, "decoder", 1, model)
    # No max_concurrency: the default; far more tokens than the test waits for.
    write_config(tmp_path, "decoder", {"stateful": "auto", "generate": {"max_new_tokens": 4000}})
    firsts: list[int | None] = [None] * STREAMS
    leave = threading.Event()

    def stream(index: int, url: str) -> None:
        body = {"input_ids": PROMPTS[index]}
        with httpx.stream("POST", url, json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and firsts[index] is None:
                    firsts[index] = json.loads(line[6:])["token_id"]
                if leave.is_set():
                    break  # the client goes away: its sequence leaves

    with LiveServer(create_app(tmp_path)) as live:
        service: InferenceService = live.app.state.server  # type: ignore[attr-defined]
        served = service.find("decoder", None)
        url = f"http://{live.url}/v2/models/decoder/generate_stream"
        threads = [threading.Thread(target=stream, args=(i, url)) for i in range(STREAMS)]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: bool(schedulers_of(served.compiled)), 30, "a scheduler")
            (scheduler,) = schedulers_of(served.compiled)
            wait_until(
                lambda: scheduler.counts().running == STREAMS, 30, "every generation running"
            )
            assert scheduler.counts().waiting == 0
        finally:
            leave.set()
            for thread in threads:
                thread.join(60)
        wait_until(lambda: scheduler.counts().running == 0, 30, "the clients' sequences left")
    assert firsts == [reference_generation(model, p, 1)[0][0] for p in PROMPTS]


def test_a_served_decoder_projects_the_last_position_unless_its_config_asks_for_all(
    tmp_path: Path,
) -> None:
    shutil.copytree(HF_DECODERS / "llama_gqa", tmp_path / "exported")  # as optimum wrote it
    shutil.copytree(HF_DECODERS / "llama_gqa", tmp_path / "every_position")
    configs = {"every_position": ModelConfig(properties={"LOGITS": "ALL"})}
    _, cases, _ = hf_decoder("llama_gqa")
    with LiveServer(create_app(ModelRepository(tmp_path, configs))) as live:
        service: InferenceService = live.app.state.server  # type: ignore[attr-defined]
        positions = {
            name: str(service.find(name, None).compiled.output("logits").shape[1])
            for name in ("exported", "every_position")
        }
        assert positions == {"exported": "1", "every_position": "sequence_length"}
        for name in positions:
            for case in cases[::3]:
                body = {"input_ids": case.input_ids, "parameters": {"max_new_tokens": 16}}
                url = f"http://{live.url}/v2/models/{name}/generate"
                answer = httpx.post(url, json=body, timeout=60).json()
                assert answer["output_ids"] == case.output_ids, (name, len(case.input_ids))
