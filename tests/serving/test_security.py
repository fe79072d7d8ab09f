"""TLS and the API key, against a live server on loopback: httpx verifying against a CA
made in the test, the unmodified tritonclient over HTTPS with headers, plain HTTP refused."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
import trustme
from tritonclient.utils import InferenceServerException

from aioinfer import ServingConfigError
from aioinfer.serving import create_app
from aioinfer.serving.connection import ConnectionLimits
from aioinfer.serving.server import uvicorn_options
from tests.helpers import mlp_model, reference_outputs
from tests.serving.conftest import LiveServer

KEY = "s3cret-key-0123456789"
BEARER = {"Authorization": f"Bearer {KEY}"}


class Certificates:
    """A CA and a server certificate it signed for 127.0.0.1, as PEM files."""

    def __init__(self, directory: Path) -> None:
        authority = trustme.CA()
        issued = authority.issue_cert("127.0.0.1", "localhost")
        self.ca = directory / "ca.pem"
        self.cert = directory / "server.pem"
        self.key = directory / "server.key"
        authority.cert_pem.write_to_path(str(self.ca))
        issued.cert_chain_pems[0].write_to_path(str(self.cert))
        issued.private_key_pem.write_to_path(str(self.key))

    def context(self) -> ssl.SSLContext:
        """A client context that trusts the CA only."""
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secure") / "mlp.onnx"
    onnx.save(mlp_model(), path)
    return path


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def secure(model_file: Path, certificates: Certificates) -> Iterator[LiveServer]:
    """HTTPS with an API key."""
    options = uvicorn_options(ConnectionLimits(), certificates.cert, certificates.key)
    with LiveServer(create_app(model_file, api_key=KEY), **options) as live:
        yield live


def rows(count: int) -> np.ndarray:
    return np.random.default_rng(count).standard_normal((count, 4)).astype(np.float32)


def infer_body(x: np.ndarray) -> dict[str, object]:
    tensor = {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    return {"inputs": [tensor]}


# -- TLS ----------------------------------------------------------------------------------


def test_https_with_a_verified_certificate_and_plain_http_refused(secure, certificates):
    base = f"https://{secure.url}"
    with httpx.Client(verify=certificates.context(), timeout=30) as client:
        live = client.get(f"{base}/v2/health/live")
        assert live.status_code == 200 and live.json() == {"live": True}
        answer = client.post(
            f"{base}/v2/models/mlp/infer", json=infer_body(rows(2)), headers=BEARER
        )
        assert answer.status_code == 200
        y = np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(2, 3)
        expected = reference_outputs(mlp_model(), {"x": rows(2)})[0]
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    # A client that trusts only the system's CAs refuses the server's certificate.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{base}/v2/health/live", verify=ssl.create_default_context())
    # Plain HTTP on the TLS port gets no answer.
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{secure.url}/v2/health/live", timeout=30)


def test_tritonclient_over_https_with_the_key_in_headers(secure, certificates):
    client = httpclient.InferenceServerClient(
        secure.url, ssl=True, ssl_options={"ca_certs": str(certificates.ca)}
    )
    assert client.is_server_live() and client.is_server_ready()  # health: no key
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("mlp")
    assert caught.value.status() == "401"
    assert "needs the server's API key" in str(caught.value)
    wrong = {"Authorization": "Bearer not-the-key"}
    with pytest.raises(InferenceServerException, match="the API key is not valid"):
        client.get_model_metadata("mlp", headers=wrong)
    assert client.get_model_metadata("mlp", headers=dict(BEARER))["name"] == "mlp"
    tensor = httpclient.InferInput("x", [3, 4], "FP32")
    tensor.set_data_from_numpy(rows(3))
    with pytest.raises(InferenceServerException, match="needs the server's API key"):
        client.infer("mlp", [tensor])
    for headers in (BEARER, {"X-API-Key": KEY}):
        # A copy: tritonclient adds its own headers to the dict it is given.
        result = client.infer("mlp", [tensor], headers=dict(headers))
        expected = reference_outputs(mlp_model(), {"x": rows(3)})[0]
        np.testing.assert_allclose(result.as_numpy("y"), expected, rtol=1e-5, atol=1e-6)


# -- the API key --------------------------------------------------------------------------

PROTECTED = [
    ("GET", "/v2"),
    ("GET", "/v2/models/mlp"),
    ("GET", "/v2/models/mlp/versions/1"),
    ("GET", "/v2/models/mlp/ready"),
    ("POST", "/v2/models/mlp/infer"),
    ("POST", "/v2/models/mlp/versions/1/infer"),
    ("GET", "/v2/no/such/endpoint"),  # unknown paths too: no probing without the key
    ("GET", "/metrics"),
]


def test_every_endpoint_but_health_needs_the_key(secure, certificates):
    with httpx.Client(
        base_url=f"https://{secure.url}", verify=certificates.context(), timeout=30
    ) as client:
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert client.get(path).status_code == 200, path
        body = infer_body(rows(1))
        for method, path in PROTECTED:
            missing = client.request(method, path, json=body)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"] == 'Bearer realm="aioinfer"'
            assert "needs the server's API key" in missing.json()["error"]
            for wrong in (
                {"Authorization": f"Bearer {KEY}x"},
                {"Authorization": f"Bearer {KEY[:-1]}"},
                {"Authorization": f"Basic {KEY}"},
                {"X-API-Key": ""},
            ):
                refused = client.request(method, path, json=body, headers=wrong)
                assert refused.status_code == 401, (path, wrong)
            invalid = client.request(method, path, json=body, headers={"X-API-Key": "no"})
            assert invalid.json() == {"error": "the API key is not valid"}
            assert 'error="invalid_token"' in invalid.headers["www-authenticate"]
            for headers in (BEARER, {"authorization": f"bearer {KEY}"}, {"X-API-Key": KEY}):
                allowed = client.request(method, path, json=body, headers=headers)
                assert allowed.status_code != 401, (path, headers)
                expected = 404 if "no/such" in path else 200
                assert allowed.status_code == expected, (path, allowed.text)


def test_public_metrics_and_no_key_by_default(model_file: Path):
    with LiveServer(create_app(model_file, api_key=KEY, public_metrics=True)) as live:
        assert httpx.get(f"http://{live.url}/metrics").status_code == 200
        assert httpx.get(f"http://{live.url}/v2").status_code == 401
    with LiveServer(create_app(model_file)) as live:  # no key: everything open
        assert httpx.get(f"http://{live.url}/v2").status_code == 200
        assert httpx.get(f"http://{live.url}/metrics").status_code == 200


def test_bad_security_options_are_refused(model_file: Path, certificates: Certificates):
    with pytest.raises(ServingConfigError, match="the API key is empty"):
        create_app(model_file, api_key="")
    with pytest.raises(ServingConfigError, match="ssl_keyfile needs ssl_certfile"):
        uvicorn_options(ConnectionLimits(), None, certificates.key)
    with pytest.raises(ServingConfigError, match=r"ssl_certfile .* is not a file"):
        uvicorn_options(ConnectionLimits(), model_file.parent / "none.pem")
