"""An exporter's decoder folder served with nothing added: the rule that tells a decoder,
and ``aioinfer serve FOLDER --model-name NAME`` answering OpenAI's client."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import onnx
import openai
import pytest

from aioinfer.serving.decoder_folder import is_decoder_export, served_decoder
from aioinfer.serving.repository import ModelRepository
from tests.helpers import HF_DECODERS, mlp_model
from tests.serving.test_cli_serve import start, wait_for

pytestmark = pytest.mark.anyio


def test_a_decoder_is_told_by_its_architecture_its_generation_config_or_its_cache(
    tmp_path: Path,
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    assert not is_decoder_export(tmp_path)
    assert not is_decoder_export(tmp_path, ["input_ids", "attention_mask"])
    assert is_decoder_export(tmp_path, ["input_ids", "past_key_values.0.key"])
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert is_decoder_export(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["QwenForCausalLM"]}))
    assert is_decoder_export(tmp_path)
    (tmp_path / "config.json").unlink()
    (tmp_path / "generation_config.json").write_text("{}")
    assert is_decoder_export(tmp_path)


async def test_a_bare_export_is_a_decoder_by_its_inputs_and_an_encoder_is_not(
    tmp_path: Path,
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(HF_DECODERS / "llama_gqa" / "model.onnx", bare / "model.onnx")
    entry = (await _entries(bare))[0]
    assert entry.config.stateful == "auto" and entry.config.generate == {}
    assert entry.config.hint == "LATENCY" and entry.config.max_concurrency == 32
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    onnx.save(mlp_model(), encoder / "model.onnx")
    plain = ModelRepository(encoder).models["encoder"]
    assert await served_decoder(plain) is plain
    full = (await _entries(HF_DECODERS / "llama_gqa"))[0]
    assert full.config.generate == {"eos_token_id": [2]}  # its generation_config.json


async def _entries(folder: Path) -> list:  # type: ignore[type-arg]
    repository = ModelRepository(folder)
    return [await served_decoder(entry) for entry in repository.models.values()]


def test_serve_an_optimum_folder_by_another_name() -> None:
    folder = HF_DECODERS / "llama_mha"
    process, lines = start(str(folder), "--model-name", "tiny-llama", "--port", "0")
    try:
        port = wait_for(lines, r"running on http://127\.0\.0\.1:(\d+)").group(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
        assert [model.id for model in client.models.list()] == ["tiny-llama"]
        answer = client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert answer.usage is not None and answer.usage.completion_tokens <= 4
        assert answer.choices[0].finish_reason in ("stop", "length")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) in (0, -signal.SIGTERM)
