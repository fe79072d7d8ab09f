"""OpenAI's API with the official ``openai`` client (and LangChain's ``ChatOpenAI``) against
a real server: optimum's decoder folders served as they are, in a repository beside a
model that does not generate; one server for the module."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import openai
import pytest

from aioinfer.serving import create_app
from aioinfer.serving.repository import ModelConfig, ModelRepository
from tests.helpers import HF_DECODERS, hf_decoder, mlp_model
from tests.serving.conftest import LiveServer

tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[3]
KEY = "test-key"
MODEL = "llama_gqa"
LIMITED = "limited"
"""llama_mha with one running sequence and no waiting one: the second is refused."""
HELLO = [1, 311, 273, 81]
"""The reference prompt "Hello" as token ids (the tokenizer adds ``<s>``, 1)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(HF_DECODERS / "llama_gqa", root / MODEL)  # optimum's folder as it is
    shutil.copytree(HF_DECODERS / "llama_mha", root / LIMITED)
    (root / "mlp" / "1").mkdir(parents=True)
    onnx.save(mlp_model(), root / "mlp" / "1" / "model.onnx")
    limits = {"eos_token_id": [2], "max_running_sequences": 1, "max_waiting_sequences": 0}
    configs = {LIMITED: ModelConfig(stateful="auto", generate=limits)}
    app = create_app(ModelRepository(root, configs), api_key=KEY)
    with LiveServer(app) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer() -> object:
    return tokenizers.Tokenizer.from_file(str(HF_DECODERS / MODEL / "tokenizer.json"))


def greedy_text(client: openai.OpenAI, prompt: str | list[int], max_tokens: int = 16) -> str:
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0
    )
    return answer.choices[0].text


def running(server: LiveServer, model: str) -> float:
    """The running-sequences gauge of ``model`` in ``/metrics``."""
    text = httpx.get(f"http://{server.url}/metrics", headers={"x-api-key": KEY}).text
    found = re.search(rf'aioinfer:num_requests_running{{model="{model}",version="1"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def wait_for_running(server: LiveServer, model: str, value: float, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if running(server, model) == value:
            return True
        time.sleep(0.02)
    return False


def test_lists_every_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [LIMITED, MODEL, "mlp"]
    assert {m.object for m in models.data} == {"model"}
    assert client.models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize("as_ids", [False, True])
def test_greedy_completion_is_transformers_text(
    client: openai.OpenAI, tokenizer: object, as_ids: bool
) -> None:
    _, cases, _ = hf_decoder(MODEL)
    record = json.loads((HF_DECODERS / f"{MODEL}.json").read_text())
    texts = [case.get("text") for case in record["cases"]]
    for case, text in zip(cases, texts):
        if text is None and not as_ids:
            continue
        prompt = case.input_ids if as_ids else text
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
        expected = tokenizer.decode(case.output_ids, skip_special_tokens=True)  # type: ignore[attr-defined]
        assert answer.choices[0].text == expected
        assert answer.choices[0].finish_reason == "length"
        assert answer.object == "text_completion" and answer.model == MODEL
        assert answer.usage is not None
        assert answer.usage.prompt_tokens == len(case.input_ids)
        assert answer.usage.completion_tokens == 16
        assert answer.usage.total_tokens == len(case.input_ids) + 16


def test_chat_is_the_completion_of_the_rendered_template(
    client: openai.OpenAI, tokenizer: object
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    answer = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    # chat_template.jinja: "{{ bos_token }}" then "role: content\n" each, "assistant:"
    rendered = "<s>system: Be brief.\nuser: Hi\nassistant:"
    ids = tokenizer.encode(rendered, add_special_tokens=False).ids  # type: ignore[attr-defined]
    assert answer.choices[0].message.content == greedy_text(client, ids, 12)
    assert answer.choices[0].message.role == "assistant"
    assert answer.object == "chat.completion"
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "H"}, {"type": "text", "text": "i"}]}
    ]
    same = client.chat.completions.create(
        model=MODEL,
        messages=parts,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    plain = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, temperature=0
    )
    assert same.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.anyio
async def test_streamed_chat_chunks_are_openais(server: LiveServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"http://{server.url}/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": "Hello there"}]
    whole = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0,  # type: ignore[arg-type]
    )
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    await client.close()
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    with_choices = [chunk for chunk in chunks if chunk.choices]
    assert [c.choices[0].finish_reason for c in with_choices][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_stream_ends_with_done_and_never_splits_a_character(server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": "Every", "max_tokens": 24, "temperature": 0, "stream": True}
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", f"http://{server.url}/v1/completions", json=body, headers=headers
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in events[:-1]]
    texts = [chunk["choices"][0]["text"] for chunk in chunks]
    whole = "".join(texts)
    assert (
        whole
        == httpx.post(
            f"http://{server.url}/v1/completions", json={**body, "stream": False}, headers=headers
        ).json()["choices"][0]["text"]
    )
    # A replacement character in a chunk only where the whole text has one there.
    offset = 0
    for text in texts:
        for index, char in enumerate(text):
            assert char != "\ufffd" or whole[offset + index] == "\ufffd"
        offset += len(text)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_n_choices_and_seeded_sampling_are_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str]:
        answer = client.completions.create(
            model=MODEL,
            prompt="Hello",
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            n=2,
            extra_body={"ignore_eos": True},
        )
        assert [choice.index for choice in answer.choices] == [0, 1]
        assert answer.usage is not None and answer.usage.completion_tokens == 24
        return [choice.text for choice in answer.choices]

    first = sample(7)
    assert sample(7) == first
    assert first[0] != first[1]  # each choice draws with its own seed
    assert sample(8) != first


def test_stop_strings_end_the_text_before_them(client: openai.OpenAI) -> None:
    full = greedy_text(client, HELLO)
    stop = full[5:8]  # across token boundaries, not at the start
    cut = full[: full.find(stop)]
    answer = client.completions.create(
        model=MODEL, prompt=HELLO, max_tokens=16, temperature=0, stop=[stop, "never there"]
    )
    assert answer.choices[0].text == cut
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.completion_tokens < 16


def test_max_tokens_and_max_completion_tokens(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=MODEL, prompt=HELLO, max_tokens=3, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=5,
        temperature=0,
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 5


def test_a_request_past_the_context_length_is_400(client: openai.OpenAI) -> None:
    """The model's ``max_position_embeddings`` (256) bounds prompt plus ``max_tokens``:
    past it, a 400 that names both; without ``max_tokens``, the room left."""
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        client.completions.create(model=MODEL, prompt=[5] * 250, max_tokens=16, temperature=0)
    answer = client.completions.create(
        model=MODEL, prompt=[5] * 250, temperature=0, extra_body={"ignore_eos": True}
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    assert answer.choices[0].finish_reason == "length"


def test_logprobs(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        values = [top.logprob for top in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] <= 0
        assert entry.logprob == values[0]  # greedy: the most likely token
        assert entry.token == entry.top_logprobs[0].token
        assert entry.bytes == list(entry.token.encode())
    completion = client.completions.create(
        model=MODEL, prompt=HELLO, max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens or []) == 6
    assert all(len(top) <= 2 for top in logprobs.top_logprobs or [])
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0
    assert (
        client.completions.create(model=MODEL, prompt=HELLO, max_tokens=2).choices[0].logprobs
        is None
    )


def test_penalties_and_echo(client: openai.OpenAI) -> None:
    case = "The quick brown fox"  # transformers repeats a token on it

    def repeats(**options: object) -> tuple[str, int]:
        answer = client.completions.create(
            model=MODEL, prompt=case, max_tokens=16, temperature=0, logprobs=0, **options
        )
        tokens = answer.choices[0].logprobs.tokens  # type: ignore[union-attr]
        # Parts of a character all read "\ufffd": count the whole characters.
        return answer.choices[0].text, max(Counter(t for t in tokens if t != "\ufffd").values())

    plain, most = repeats()
    penalized, penalized_most = repeats(frequency_penalty=2.0)
    assert penalized != plain
    assert penalized_most < most
    assert repeats(presence_penalty=2.0)[1] < most
    echoed = client.completions.create(
        model=MODEL, prompt=case, max_tokens=16, temperature=0, echo=True
    )
    assert echoed.choices[0].text == case + plain


def test_unknown_model_bad_fields_and_keys(client: openai.OpenAI, server: LiveServer) -> None:
    hi = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=hi)  # type: ignore[arg-type]
    assert missing.value.status_code == 404
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    refusals = {
        "tools": {"tools": [{"type": "function", "function": {"name": "f"}}]},
        "response_format": {"response_format": {"type": "json_object"}},
        "temperature": {"temperature": "hot"},
        "messages[0].content[0]": {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
        },
        "logit_bias": {"logit_bias": {"5": 10}},
    }
    for param, fields in refusals.items():
        options = {"model": MODEL, "messages": hi, **fields}
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**options)  # type: ignore[call-overload]
        assert refused.value.body["param"] == param  # type: ignore[index]
        assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as no_text:
        client.completions.create(model="mlp", prompt="Hi")
    assert "does not generate text" in no_text.value.message
    url = f"http://{server.url}/v1"
    other = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        other.models.list()
    assert denied.value.body["type"] == "authentication_error"  # type: ignore[index]
    keyless = httpx.post(f"{url}/completions", json={"model": MODEL, "prompt": "Hi"})
    assert keyless.status_code == 401
    assert keyless.json()["error"]["type"] == "authentication_error"


def test_full_queue_is_503_with_retry_after(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"http://{server.url}/v1", api_key=KEY, max_retries=0)
    # The model runs one sequence and lets none wait: a second choice finds it full.
    with pytest.raises(openai.InternalServerError) as refused:
        client.completions.create(model=LIMITED, prompt=HELLO, max_tokens=50, n=2)
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.body["type"] == "server_error"  # type: ignore[index]
    assert wait_for_running(server, LIMITED, 0)
    answer = client.completions.create(model=LIMITED, prompt=HELLO, max_tokens=2)
    assert answer.choices[0].finish_reason is not None


@pytest.mark.anyio
async def test_a_client_that_leaves_mid_stream_frees_its_sequence(server: LiveServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"http://{server.url}/v1", api_key=KEY, max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=200,
        extra_body={"ignore_eos": True},
        stream=True,
    )
    seen = []
    async for _ in stream:
        seen.append(running(server, MODEL))  # the control: it runs while the client reads
        break
    assert seen == [1]
    await stream.close()
    await client.close()
    assert wait_for_running(server, MODEL, 0)


def test_a_client_that_times_out_frees_its_sequence(
    client: openai.OpenAI, server: LiveServer
) -> None:
    options = {"model": MODEL, "prompt": HELLO, "extra_body": {"ignore_eos": True}, "n": 8}
    started = time.perf_counter()
    client.completions.create(max_tokens=200, **options)  # the control: the whole generation
    whole = time.perf_counter() - started
    impatient = client.with_options(timeout=whole / 4)
    started = time.perf_counter()
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(max_tokens=200, **options)
    assert wait_for_running(server, MODEL, 0)
    freed = time.perf_counter() - started
    assert freed < whole * 0.9  # before the generation would have ended


def test_langchain_chat_openai_streams(server: LiveServer, client: openai.OpenAI) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(
        base_url=f"http://{server.url}/v1",
        api_key=KEY,
        model=MODEL,
        temperature=0,
        max_tokens=8,
        max_retries=0,
    )
    chunks = [chunk.content for chunk in chat.stream("Hi")]
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert len(chunks) > 1
    assert "".join(map(str, chunks)) == whole.choices[0].message.content


def test_the_example_client_runs_against_the_server(server: LiveServer) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "examples/openai_client.py",
            "--base-url",
            f"http://{server.url}/v1",
            "--api-key",
            KEY,
            "--model",
            MODEL,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"models: {LIMITED}, {MODEL}, mlp"
    assert lines[1].startswith("chat: ") and re.fullmatch(r"usage: \d+ \+ 16 tokens", lines[2])
    assert [line.split(":")[0] for line in lines[3:]] == ["completion 0", "completion 1"]
