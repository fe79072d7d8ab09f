"""Triton's version policy: which versions of a model are served, and what every endpoint
says of the others, with the unmodified tritonclient over HTTP and gRPC."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from aioinfer import RepositoryError
from aioinfer.serving import ModelConfig, ModelRepository, VersionPolicy, create_app
from aioinfer.serving.model_config import apply_override
from aioinfer.serving.service import InferenceService
from tests.helpers import mlp_model
from tests.serving.conftest import LiveServer, write_config, write_model
from tests.serving.grpc.live import LiveGrpcServer
from tests.serving.triton_models import simple_model

SERVED = {"simple": ["2"], "every": ["1", "2"], "chosen": ["1", "3"], "last_two": ["2", "3"]}
"""The versions each model of the repository serves under its policy."""
HELD = {
    "simple": ["1", "2"],
    "every": ["1", "2"],
    "chosen": ["1", "2", "3"],
    "last_two": ["1", "2", "3"],
}
"""The versions in the repository."""
POLICIES = {
    "simple": {"latest": {"num_versions": 1}},  # no config.json: Triton's default
    "every": {"all": {}},
    "chosen": {"specific": {"versions": [1, 3]}},
    "last_two": {"latest": {"num_versions": 2}},
}


def write_policy_repository(repo: Path) -> Path:
    """``simple`` (Triton's example model, versions 1 and 2, no config) and three models
    of mlp versions whose configs name a policy."""
    for version in (1, 2):
        write_model(repo, "simple", version, simple_model())
    for name, versions in HELD.items():
        if name == "simple":
            continue
        for version in versions:
            write_model(repo, name, int(version), mlp_model(seed=int(version)))
        write_config(repo, name, {"batching": False, "version_policy": POLICIES[name]})
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGrpcServer]:
    repo = write_policy_repository(tmp_path_factory.mktemp("policies"))
    with LiveGrpcServer(repo) as live:
        yield live


class Client:
    """The calls the tests make, over one transport, answered as plain values."""

    def __init__(self, transport: str, server: LiveGrpcServer) -> None:
        self.grpc = transport == "grpc"
        self.module: Any = grpcclient if self.grpc else httpclient
        url = server.grpc_url if self.grpc else server.url
        self.client: Any = self.module.InferenceServerClient(url)
        self.not_found = "StatusCode.NOT_FOUND" if self.grpc else "404"

    def _json(self) -> dict[str, Any]:
        return {"as_json": True} if self.grpc else {}

    def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return dict(self.client.get_model_metadata(model, version, **self._json()))

    def statistics(self, model: str, version: str = "") -> list[dict[str, Any]]:
        answer = self.client.get_inference_statistics(model, version, **self._json())
        return list(answer["model_stats"])

    def index(self) -> list[dict[str, Any]]:
        answer = self.client.get_model_repository_index(**self._json())
        return list(answer["models"] if self.grpc else answer)

    def ready(self, model: str, version: str = "") -> bool:
        return bool(self.client.is_model_ready(model, version))

    def config(self, model: str) -> dict[str, Any]:
        answer = self.client.get_model_config(model, **self._json())
        return dict(answer["config"] if self.grpc else answer)

    def infer(self, model: str, version: str = "") -> str:
        """The version that answered an inference of ``model`` at ``version``."""
        if model == "simple":
            arrays = {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)}
            kind = "INT32"
        else:
            arrays, kind = {"x": np.ones((1, 4), np.float32)}, "FP32"
        inputs = []
        for name, array in arrays.items():
            tensor = self.module.InferInput(name, list(array.shape), kind)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = self.client.infer(model, inputs, model_version=version)
        return str(result.get_response(**self._json())["model_version"])

    def close(self) -> None:
        self.client.close()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: LiveGrpcServer) -> Iterator[Client]:
    client = Client(request.param, server)
    yield client
    client.close()


@pytest.mark.parametrize("model", sorted(SERVED))
def test_each_policy_serves_its_versions_only(client: Client, model: str) -> None:
    served = SERVED[model]
    assert client.metadata(model)["versions"] == served
    assert [entry["version"] for entry in client.statistics(model)] == served
    assert client.infer(model) == served[-1]  # no version named: the latest served
    for version in served:
        assert client.ready(model, version)
        assert client.infer(model, version) == version
        assert [entry["version"] for entry in client.statistics(model, version)] == [version]
    for version in sorted(set(HELD[model]) - set(served)):
        assert not client.ready(model, version)
        for call in (client.infer, client.metadata, client.statistics):
            with pytest.raises(InferenceServerException) as caught:
                call(model, version)
            assert caught.value.status() == client.not_found
            message = caught.value.message()
            # Triton's wording, then aioinfer's why.
            assert message.startswith(
                f"Request for unknown model: '{model}' version {version} is not found"
            )
            policy = json.dumps(POLICIES[model])
            assert f"not served under the version policy {policy}" in message
            assert message.endswith(f"served versions: {', '.join(served)}")


def test_the_index_lists_the_served_versions(client: Client) -> None:
    listed = [(e["name"], e["version"], e["state"]) for e in client.index()]
    expected = [(model, v, "READY") for model in sorted(SERVED) for v in SERVED[model]]
    assert listed == expected


def test_model_config_reports_the_policy(server: LiveGrpcServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for model, policy in POLICIES.items():
        assert client.get_model_config(model)["version_policy"] == policy
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        config = grpc_client.get_model_config("chosen").config
        assert list(config.version_policy.specific.versions) == [1, 3]
        assert (
            grpc_client.get_model_config("last_two").config.version_policy.latest.num_versions == 2
        )


def test_tritonclients_http_example_flows_pass_with_two_versions(tmp_path: Path) -> None:
    """simple_http_infer_client.py and simple_http_aio_infer_client.py check that the
    statistics of ``simple`` hold one entry; here its folder holds versions 1 and 2, and
    no config.json."""
    for version in (1, 2):
        write_model(tmp_path, "simple", version, simple_model())
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)

    async def aio_flow(url: str) -> int:
        async with aioclient.InferenceServerClient(url) as client:
            await client.infer("simple", inputs)
            statistics = await client.get_inference_statistics(model_name="simple")
            return len(statistics["model_stats"])

    with LiveServer(create_app(tmp_path)) as server:
        client = httpclient.InferenceServerClient(server.url)
        client.infer("simple", inputs)
        assert len(client.get_inference_statistics(model_name="simple")["model_stats"]) == 1
        assert asyncio.run(aio_flow(server.url)) == 1


# -- a reload under the policy -------------------------------------------------------------


def test_a_reload_serves_a_new_latest_and_lists_the_old_as_unloaded(tmp_path: Path) -> None:
    for version in (1, 2):
        write_model(tmp_path, "grow", version, mlp_model(seed=version))
    with (
        LiveGrpcServer(tmp_path, model_control_mode="explicit") as live,
        grpcclient.InferenceServerClient(live.grpc_url) as client,
    ):
        client.load_model("grow")
        assert client.get_model_metadata("grow").versions == ["2"]
        write_model(tmp_path, "grow", 3, mlp_model(seed=3))
        client.load_model("grow")  # Triton's poll: version 3 is now the latest
        index = client.get_model_repository_index(as_json=True)["models"]
        states = [(e["version"], e["state"], e.get("reason", "")) for e in index]
        assert states == [("2", "UNAVAILABLE", "unloaded"), ("3", "READY", "")]
        assert not client.is_model_ready("grow", "2") and client.is_model_ready("grow", "3")
        ready_only = httpx.post(f"http://{live.url}/v2/repository/index", json={"ready": True})
        assert [e["version"] for e in ready_only.json()] == ["3"]
        # A config override with a policy, as Triton's load takes one.
        client.load_model("grow", config=json.dumps({"version_policy": {"all": {}}}))
        index = client.get_model_repository_index(as_json=True)["models"]
        assert [(e["version"], e["state"]) for e in index] == [
            ("1", "READY"),
            ("2", "READY"),
            ("3", "READY"),
        ]
        client.unload_model("grow")
        index = client.get_model_repository_index(as_json=True)["models"]
        assert [(e["name"], e["state"], e["reason"]) for e in index] == [
            ("grow", "UNAVAILABLE", "unloaded")
        ]


# -- the policy's forms and errors ----------------------------------------------------------


def test_latest_is_the_numerically_highest() -> None:
    versions = ["1", "2", "10"]
    assert VersionPolicy().select(versions) == ["10"]
    assert VersionPolicy("latest", num_versions=2).select(versions) == ["2", "10"]
    assert VersionPolicy("latest", num_versions=5).select(versions) == ["1", "2", "10"]
    assert VersionPolicy("all").select(versions) == ["1", "2", "10"]
    assert VersionPolicy("specific", versions=(2, 7)).select(versions) == ["2"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"all": {}}, VersionPolicy("all")),
        ({"latest": {"num_versions": 3}}, VersionPolicy("latest", num_versions=3)),
        # protobuf's JSON writes 64-bit integers as strings
        ({"specific": {"versions": ["3", 1, 3]}}, VersionPolicy("specific", versions=(1, 3))),
    ],
)
def test_the_forms_of_tritons_policy_are_read(policy: Any, expected: VersionPolicy) -> None:
    assert VersionPolicy.from_mapping(policy, "config.json") == expected
    assert VersionPolicy.from_mapping(expected.to_mapping(), "config.json") == expected


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ({"newest": {}}, ['\'version_policy\' must be {"latest": {"num_versions": N}}', "newest"]),
        ({"latest": {"num_versions": 1}, "all": {}}, ["'version_policy' must be", '"all": {}}']),
        ({"latest": {}}, ["'num_versions' must be an integer >= 1, got None"]),
        ({"latest": {"num_versions": 0}}, ["'num_versions' must be an integer >= 1, got 0"]),
        ({"latest": {"num_versions": True}}, ["'num_versions'", "got True"]),
        ({"latest": {"versions": [1]}}, ["'latest' must be an object with key(s): num_versions"]),
        ({"all": {"num_versions": 1}}, ["'all' must be an object with key(s): none"]),
        ({"specific": {"versions": []}}, ["'specific' must list its 'versions'"]),
        ({"specific": {"versions": [1, "x"]}}, ["'versions' must be integers >= 1, got 'x'"]),
        ({"specific": [1, 2]}, ["'specific' must be an object with key(s): versions"]),
        ("latest", ["'version_policy' must be object, got 'latest'"]),
    ],
)
def test_a_bad_policy_is_a_clear_error(tmp_path: Path, policy: Any, words: list[str]) -> None:
    write_model(tmp_path, "m", 1, mlp_model())
    write_config(tmp_path, "m", {"version_policy": policy})
    with pytest.raises(RepositoryError) as caught:
        ModelRepository(tmp_path)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "m" / "config.json"))
    for word in words:
        assert word in message


def test_a_bad_policy_fails_a_load_over_tritonclient(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 1, mlp_model())
    with LiveGrpcServer(tmp_path, model_control_mode="explicit") as live:
        client = httpclient.InferenceServerClient(live.url)
        write_config(tmp_path, "m", {"version_policy": {"latest": {"num_versions": 0}}})
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("m")
        assert caught.value.status() == "400"
        message = caught.value.message()
        assert message.startswith("failed to load 'm'")
        assert "'num_versions' must be an integer >= 1, got 0" in message
        shutil.rmtree(tmp_path / "m" / "1")
        write_model(tmp_path, "m", 2, mlp_model())
        write_config(tmp_path, "m", {"version_policy": {"specific": {"versions": [1]}}})
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("m")
        message = caught.value.message()
        assert "at least one version must be available under the version policy of model 'm'" in (
            message
        )
        assert '{"specific": {"versions": [1]}} serves none of the versions' in message
        assert not client.is_model_ready("m")


@pytest.mark.anyio
async def test_the_start_logs_the_versions_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for version in (1, 2, 3):
        write_model(tmp_path, "m", version, mlp_model())
    write_config(tmp_path, "m", {"batching": False})
    service = InferenceService(ModelRepository(tmp_path))
    with caplog.at_level(logging.INFO, logger="aioinfer.serving"), anyio.fail_after(60):
        async with service.lifespan():
            assert list(service.models["m"]) == ["3"]
    expected = "model 'm': version(s) 1, 2 not served under its version policy "
    assert expected + '{"latest": {"num_versions": 1}}' in caplog.text


@pytest.mark.anyio
async def test_a_policy_that_serves_nothing_fails_the_start(tmp_path: Path) -> None:
    write_model(tmp_path, "m", 2, mlp_model())
    write_config(tmp_path, "m", {"version_policy": {"specific": {"versions": [1]}}})
    service = InferenceService(ModelRepository(tmp_path))
    with pytest.raises(RepositoryError, match="version policy of model 'm'"):
        with anyio.fail_after(60):
            async with service.lifespan():
                pass


def test_a_listed_version_without_its_directory_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for version in (1, 2):
        write_model(tmp_path, "m", version, mlp_model())
    write_config(tmp_path, "m", {"version_policy": {"specific": {"versions": [2, 5]}}})
    with caplog.at_level(logging.WARNING, logger="aioinfer.serving"):
        entry = ModelRepository(tmp_path).models["m"]
    assert list(entry.served_versions()) == ["2"]
    assert "version 5 is specified for model 'm', but the version directory is not present" in (
        caplog.text
    )


def test_a_config_built_in_code_takes_a_policy(tmp_path: Path) -> None:
    for version in (1, 2):
        write_model(tmp_path, "m", version, mlp_model())
    every = ModelConfig(version_policy=VersionPolicy("all"))
    entry = ModelRepository(tmp_path, configs={"m": every}).models["m"]
    assert list(entry.served_versions()) == ["1", "2"]
    # A load's override keeps the policy it does not name.
    overridden = apply_override(every, '{"max_batch_size": 4}', "model 'm'")
    assert overridden.version_policy == VersionPolicy("all")
