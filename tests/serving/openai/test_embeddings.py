"""``/v1/embeddings``, ``/v1/rerank`` and KServe infer with text, against a real server
(REST and gRPC on free 127.0.0.1 ports) serving the folders of tests/data/text as they
are: the official ``openai`` client (sync and async), tritonclient (HTTP and gRPC), and
sentence-transformers' committed outputs as the reference."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.pipelines.conftest import CROSS_ENCODER, FEATURE_EXTRACTION, ST_EMBEDDER, cosines
from tests.serving.grpc.live import LiveGrpcServer

openai = pytest.importorskip("openai")
pytest.importorskip("tokenizers")

# sentence-transformers' layout (onnx/model.onnx) and optimum's (model.onnx)
EMBEDDERS = {"st-embedder": "normalized", "feature-extraction": "feature_extraction"}


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads((ST_EMBEDDER.parent / "reference.json").read_text())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGrpcServer]:
    """The three folders in one repository, copied as they are, beside a plain model."""
    repo = tmp_path_factory.mktemp("text-repo")
    for folder in (ST_EMBEDDER, FEATURE_EXTRACTION, CROSS_ENCODER):
        shutil.copytree(folder, repo / folder.name)
    with LiveGrpcServer(repo) as server:
        yield server


@pytest.fixture(scope="module")
def client(live: LiveGrpcServer) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"http://{live.url}/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.mark.parametrize("name", sorted(EMBEDDERS))
@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
def test_embeddings_equal_sentence_transformers(
    client: Any, reference: dict[str, Any], name: str, encoding_format: str | None
) -> None:
    ref = reference["embeddings"]
    options = {} if encoding_format is None else {"encoding_format": encoding_format}
    answer = client.embeddings.create(model=name, input=ref["texts"], **options)
    if encoding_format == "base64":  # asked for, the client leaves it encoded
        vectors = np.array([_decode(item.embedding) for item in answer.data])
    else:  # not asked for, the client asks base64 and decodes it
        vectors = np.array([item.embedding for item in answer.data])
    assert [item.index for item in answer.data] == list(range(len(ref["texts"])))
    assert answer.model == name
    assert cosines(vectors, ref[EMBEDDERS[name]]).min() >= 0.9999
    np.testing.assert_allclose(vectors, ref[EMBEDDERS[name]], rtol=1e-4, atol=1e-5)
    if name == "st-embedder":  # its token counts, truncated at its max_seq_length
        assert answer.usage.prompt_tokens == sum(ref["token_counts"])


def _decode(text: str) -> np.ndarray:
    """A base64 embedding: little-endian float32, as the openai client reads it."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


@pytest.mark.anyio
async def test_async_client_dimensions_and_token_ids(
    live: LiveGrpcServer, reference: dict[str, Any]
) -> None:
    ref = reference["embeddings"]
    from tokenizers import Tokenizer

    ids = [
        e.ids
        for e in Tokenizer.from_file(str(ST_EMBEDDER / "tokenizer.json")).encode_batch(
            ref["texts"][:3]
        )
    ]
    async with openai.AsyncOpenAI(
        base_url=f"http://{live.url}/v1", api_key="none", max_retries=0
    ) as client:
        short = await client.embeddings.create(
            model="st-embedder", input=ref["texts"], dimensions=16
        )
        one = await client.embeddings.create(model="st-embedder", input=ref["texts"][1])
        from_ids = await client.embeddings.create(model="st-embedder", input=ids)
        single_ids = await client.embeddings.create(model="st-embedder", input=ids[1])
    truncated = np.array([item.embedding for item in short.data])
    assert truncated.shape == (len(ref["texts"]), 16)
    np.testing.assert_allclose(truncated, ref["truncate_dim_16"], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(truncated, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(one.data[0].embedding, ref["normalized"][1], atol=1e-5)
    vectors = np.array([item.embedding for item in from_ids.data])
    np.testing.assert_allclose(vectors, ref["normalized"][:3], atol=1e-5)
    np.testing.assert_allclose(single_ids.data[0].embedding, ref["normalized"][1], atol=1e-5)
    assert from_ids.usage.prompt_tokens == sum(len(i) for i in ids)


def test_truncation_as_sentence_transformers_or_400(client: Any, reference: dict[str, Any]) -> None:
    ref = reference["embeddings"]
    long_index = ref["texts"].index(max(ref["texts"], key=len))
    cut = client.embeddings.create(model="st-embedder", input=ref["texts"][long_index])
    assert cut.usage.prompt_tokens == ref["max_seq_length"]
    assert cosines([cut.data[0].embedding], [ref["normalized"][long_index]]).min() >= 0.9999
    with pytest.raises(openai.BadRequestError, match=r"maximum of 24") as refused:
        client.embeddings.create(
            model="st-embedder", input=ref["texts"][long_index], extra_body={"truncate": False}
        )
    assert refused.value.body["param"] == "input"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": []}, "input", "at least one text"),
        ({"input": ["a"] * 2049}, "input", "at most 2048 texts, got 2049"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
        ({"input": "a", "dimensions": 33}, "dimensions", "1 to 32 .*got 33"),
        ({"input": "a", "dimensions": 0}, "dimensions", "1 to 32 .*got 0"),
        ({"input": ""}, "input[0]", "non-empty string"),
        ({"input": [[1, 2], "a"]}, "input", "not a mix"),
        ({"input": [[101, 10**9]]}, "input", r"ids from 0 to \d+"),
        ({"input": {"text": "a"}}, "input", "got dict"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    client: Any, body: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=message) as refused:
        client.embeddings.create(model="st-embedder", **body)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param
    assert refused.value.body["type"] == "invalid_request_error"


def test_unknown_model_is_404_and_a_reranker_does_not_embed(client: Any) -> None:
    with pytest.raises(openai.NotFoundError, match="unknown model: 'nope'"):
        client.embeddings.create(model="nope", input="a")
    with pytest.raises(openai.BadRequestError, match="is a reranker"):
        client.embeddings.create(model="cross-encoder", input="a")


def test_rerank_equals_cross_encoder(live: LiveGrpcServer, reference: dict[str, Any]) -> None:
    ref = reference["rerank"]
    body = {"model": "cross-encoder", "query": ref["query"], "documents": ref["documents"]}
    answers = [
        httpx.post(f"http://{live.url}{path}", json=body, timeout=30)
        for path in ("/v1/rerank", "/rerank", "/v2/rerank")
    ]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    results = answers[0].json()["results"]
    expected = sorted(range(len(ref["documents"])), key=lambda i: -ref["scores"][i])
    assert [r["index"] for r in results] == expected
    scores = [r["relevance_score"] for r in results]
    np.testing.assert_allclose(scores, [ref["scores"][i] for i in expected], atol=1e-4)
    assert [r["document"]["text"] for r in results] == [ref["documents"][i] for i in expected]
    assert answers[1].json()["results"] == results == answers[2].json()["results"]

    cohere_shaped = {**body, "documents": [{"text": d} for d in ref["documents"]]}
    top = httpx.post(
        f"http://{live.url}/v1/rerank",
        json={**cohere_shaped, "top_n": 2, "return_documents": False},
        timeout=30,
    ).json()
    assert top["results"] == [{k: v for k, v in r.items() if k != "document"} for r in results[:2]]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"documents": []}, "documents"),
        ({"query": ""}, "query"),
        ({"top_n": 0}, "top_n"),
        ({"documents": ["a", 3]}, "documents[1]"),
        ({"model": "st-embedder"}, "model"),
    ],
)
def test_bad_rerank_is_400_naming_the_field(
    live: LiveGrpcServer, change: dict[str, Any], param: str
) -> None:
    body = {"model": "cross-encoder", "query": "q", "documents": ["a", "b"], **change}
    answer = httpx.post(f"http://{live.url}/v1/rerank", json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_tritonclient_sends_text(
    live: LiveGrpcServer, reference: dict[str, Any], transport: str
) -> None:
    if transport == "http":
        import tritonclient.http as triton

        client = triton.InferenceServerClient(live.url)
    else:
        import tritonclient.grpc as triton  # type: ignore[no-redef]

        client = triton.InferenceServerClient(live.grpc_url)
    metadata = client.get_model_metadata("st-embedder")
    if transport == "grpc":
        from google.protobuf.json_format import MessageToDict

        metadata = MessageToDict(metadata, preserving_proto_field_name=True)
    assert [(t["name"], t["datatype"]) for t in metadata["inputs"]] == [("text", "BYTES")]
    assert [(t["name"], t["datatype"]) for t in metadata["outputs"]] == [("embeddings", "FP32")]

    texts = reference["embeddings"]["texts"]
    text = triton.InferInput("text", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    vectors = client.infer("st-embedder", [text]).as_numpy("embeddings")
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, reference["embeddings"]["normalized"], atol=1e-5)

    ref = reference["rerank"]
    query = triton.InferInput("query", [1], "BYTES")
    query.set_data_from_numpy(np.array([ref["query"].encode()], dtype=object))
    documents = triton.InferInput("documents", [len(ref["documents"])], "BYTES")
    documents.set_data_from_numpy(np.array([d.encode() for d in ref["documents"]], dtype=object))
    scores = client.infer("cross-encoder", [query, documents]).as_numpy("scores")
    np.testing.assert_allclose(scores, ref["scores"], atol=1e-4)  # in the documents' order
    client.close()


def test_text_models_are_ready_and_counted(live: LiveGrpcServer, client: Any) -> None:
    base = f"http://{live.url}"
    client.embeddings.create(model="feature-extraction", input=["a", "b", "c"])
    assert httpx.get(f"{base}/v2/models/feature-extraction/ready").status_code == 200
    stats = httpx.get(f"{base}/v2/models/feature-extraction/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert stats["inference_count"] >= 3  # texts
    metrics = httpx.get(f"{base}/metrics").text
    assert 'model="feature-extraction"' in metrics


def test_a_decoder_export_is_not_a_text_model(tmp_path: Path) -> None:
    from aioinfer.serving.repository import ModelRepository
    from aioinfer.serving.text_models import text_pipeline_folder

    folder = tmp_path / "decoder"
    shutil.copytree(FEATURE_EXTRACTION, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "architectures": ["GPT2LMHeadModel"]})
    )
    assert text_pipeline_folder(ModelRepository(folder).models["decoder"]) is None
    (folder / "config.json").write_text(json.dumps(config))
    assert text_pipeline_folder(ModelRepository(folder).models["decoder"]) is not None
    (folder / "generation_config.json").write_text("{}")
    assert text_pipeline_folder(ModelRepository(folder).models["decoder"]) is None


def test_langchain_openai_embeddings(live: LiveGrpcServer, reference: dict[str, Any]) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    ref = reference["embeddings"]
    embeddings = langchain_openai.OpenAIEmbeddings(
        model="st-embedder",
        base_url=f"http://{live.url}/v1",
        api_key="none",
        check_embedding_ctx_length=False,  # it would send tiktoken's ids, not the model's
    )
    vectors = embeddings.embed_documents(ref["texts"])
    query = embeddings.embed_query(ref["texts"][2])
    np.testing.assert_allclose(vectors, ref["normalized"], atol=1e-5)
    np.testing.assert_allclose(query, ref["normalized"][2], atol=1e-5)


def test_a_client_that_goes_away_stops_its_texts(live: LiveGrpcServer) -> None:
    """A client that gives up on a large request stops its work: the control (the same
    request answered) computes every text; after a client that times out at a quarter of
    the control's time, and a wait as long as the control again, fewer texts were
    computed than it sent."""
    import time

    statistics = live.service.models["feature-extraction"]["1"].pipeline.statistics
    texts = [f"word{i} " * 120 for i in range(2000)]
    body = {"model": "feature-extraction", "input": texts}
    url = f"http://{live.url}/v1/embeddings"
    before, start = statistics.texts, time.perf_counter()
    assert httpx.post(url, json=body, timeout=300).status_code == 200
    control = time.perf_counter() - start
    assert statistics.texts - before == len(texts)
    before = statistics.texts
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url, json=body, timeout=control / 4)
    time.sleep(control)
    assert statistics.texts - before < len(texts)
