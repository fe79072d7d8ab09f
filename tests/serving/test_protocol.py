"""The protocol codec: JSON and binary tensors, every datatype, and the errors it names."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
from tritonclient.http import InferResult
from tritonclient.utils import serialize_byte_tensor

from aioinfer.model import Port
from aioinfer.serving.protocol import (
    DATATYPES,
    ProtocolError,
    RequestDecoder,
    encode_infer_response,
    parse_infer_request,
    port_metadata,
)


def port(name: str, dtype: Any, shape: tuple[Any, ...] | None = ("n", 2)) -> Port:
    element = (
        ir.DataType.STRING if np.dtype(dtype) == object else ir.DataType.from_numpy(np.dtype(dtype))
    )
    return Port(0, name, element, shape)


def request(inputs: list[dict[str, Any]], binary: bytes = b"", **extra: Any) -> tuple[bytes, str]:
    header = json.dumps({"inputs": inputs, **extra}).encode()
    return header + binary, str(len(header))


NUMERIC = [name for name in DATATYPES if name != "BYTES"]


@pytest.mark.parametrize("kind", NUMERIC)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_numeric_datatype_round_trips(kind: str, binary: bool) -> None:
    dtype = DATATYPES[kind]
    values = (np.arange(6) % 2 if kind == "BOOL" else np.arange(6) * 3).astype(dtype).reshape(3, 2)
    spec: dict[str, Any] = {"name": "x", "shape": [3, 2], "datatype": kind}
    if binary:
        spec["parameters"] = {"binary_data_size": values.nbytes}
        body, length = request([spec], values.tobytes())
    else:
        spec["data"] = values.tolist()  # nested lists are accepted too
        body, length = request([spec])
    parsed = parse_infer_request(body, length, {"x": kind})
    np.testing.assert_array_equal(parsed.inputs["x"], values)
    assert parsed.inputs["x"].dtype == dtype
    # The response decodes with tritonclient's own reader.
    content, header = encode_infer_response("m", "1", "id-1", [("y", values, binary)])
    result = InferResult.from_response_body(content, header_length=header)
    np.testing.assert_array_equal(result.as_numpy("y"), values)
    assert result.get_response()["id"] == "id-1"
    assert (header is not None) is binary


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_tensors(binary: bool) -> None:
    words = np.array([b"alpha", b"be", b"", b"delta"], dtype=object).reshape(2, 2)
    spec: dict[str, Any] = {"name": "s", "shape": [2, 2], "datatype": "BYTES"}
    if binary:
        raw = serialize_byte_tensor(words).item()
        spec["parameters"] = {"binary_data_size": len(raw)}
        body, length = request([spec], raw)
    else:
        spec["data"] = ["alpha", "be", "", "delta"]
        body, length = request([spec])
    parsed = parse_infer_request(body, length, {"s": "BYTES"})
    got = [w.decode() if isinstance(w, bytes) else w for w in parsed.inputs["s"].ravel()]
    assert got == ["alpha", "be", "", "delta"] and parsed.inputs["s"].shape == (2, 2)
    content, header = encode_infer_response("m", "1", None, [("s", words, binary)])
    result = InferResult.from_response_body(content, header_length=header)
    decoded = [w.decode() if isinstance(w, bytes) else w for w in result.as_numpy("s").ravel()]
    assert decoded == ["alpha", "be", "", "delta"]


def test_outputs_and_parameters_are_read() -> None:
    body, _ = request(
        [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
        id=42,
        parameters={"binary_data_output": True, "sequence_id": 5},
        outputs=[{"name": "a"}, {"name": "b", "parameters": {"binary_data": False}}],
    )
    parsed = parse_infer_request(body, None, {"x": "FP32"})
    assert parsed.id == "42"
    assert parsed.parameters["sequence_id"] == 5
    assert [(o.name, o.binary) for o in parsed.outputs or []] == [("a", True), ("b", False)]


def test_port_metadata_marks_dynamic_dims() -> None:
    assert port_metadata(port("x", np.float32, ("batch", 3, None))) == {
        "name": "x",
        "datatype": "FP32",
        "shape": [-1, 3, -1],
    }
    assert port_metadata(port("x", np.int64, None))["shape"] == [-1]


FP32 = {"name": "x", "shape": [1, 2], "datatype": "FP32"}


@pytest.mark.parametrize(
    ("body", "length", "message"),
    [
        (b"[1, 2", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b"{}", None, "needs 'inputs'"),
        (b"{}", "x", "must be a byte count, got 'x'"),
        (
            b"{}",
            "9" * 5000,
            "must be a byte count, got '99999999999999999999... (5000 characters)'",
        ),
        (b"{}", "99", "is 99, but the body has 2 bytes"),
        (request([dict(FP32, data=[1, 2])] * 2)[0], None, "'x' is given twice"),
        (
            request([dict(FP32, name="q", data=[1, 2])])[0],
            None,
            "no input named 'q'; its inputs are 'x'",
        ),
        (request([dict(FP32, datatype="INT8", data=[1, 2])])[0], None, "datatype 'INT8' given"),
        (request([dict(FP32, shape=[1, -2], data=[1, 2])])[0], None, "list of integers >= 0"),
        (request([dict(FP32, data=[1, 2, 3])])[0], None, "3 values in 'data', the shape needs 2"),
        (
            request([dict(FP32, data=["a", "b"])])[0],
            None,
            "element 0 of 'data' is \"a\", not a number",
        ),
        (request([dict(FP32, data=[[1], [2, 3]])])[0], None, "not FP32 values (setting an array"),
        (request([FP32])[0], None, "neither 'data' nor binary_data_size"),
        (
            request(
                [dict(FP32, data=[1, 2])],
                outputs=[{"name": "y", "parameters": {"classification": 2}}],
            )[0],
            None,
            "classification extension",
        ),
    ],
)
def test_malformed_requests_name_the_problem(body: bytes, length: str | None, message: str) -> None:
    with pytest.raises(ProtocolError, match=None) as caught:
        parse_infer_request(body, length, {"x": "FP32"})
    assert message in str(caught.value)
    assert caught.value.status == 400


def test_binary_sizes_must_add_up() -> None:
    spec = dict(FP32, parameters={"binary_data_size": 8})
    body, length = request([spec], struct.pack("<2f", 1, 2) + b"extra")
    with pytest.raises(ProtocolError, match="binary inputs take 8 bytes, but 13 follow"):
        parse_infer_request(body, length, {"x": "FP32"})
    spec = dict(FP32, parameters={"binary_data_size": 6})
    body, length = request([spec], b"\0" * 6)
    with pytest.raises(ProtocolError, match="6 binary bytes, the shape needs 2 x 4 = 8"):
        parse_infer_request(body, length, {"x": "FP32"})
    spec = dict(FP32, parameters={"binary_data_size": 80})
    body, length = request([spec], b"\0" * 8)
    with pytest.raises(ProtocolError, match="binary_data_size 80 does not fit the 8"):
        parse_infer_request(body, length, {"x": "FP32"})
    truncated = dict(FP32, datatype="BYTES", shape=[1], parameters={"binary_data_size": 6})
    body, length = request([truncated], struct.pack("<I", 9) + b"ab")
    with pytest.raises(ProtocolError, match="truncated BYTES element"):
        parse_infer_request(body, length, {"x": "BYTES"})


# -- RequestDecoder: remembered headers ----------------------------------------------------


def two_binary_inputs(a: np.ndarray, b: np.ndarray, **extra: Any) -> tuple[bytes, str]:
    specs = [
        {"name": "a", "shape": list(a.shape), "datatype": "FP32",
         "parameters": {"binary_data_size": a.nbytes}},
        {"name": "b", "shape": list(b.shape), "datatype": "INT64",
         "parameters": {"binary_data_size": b.nbytes}},
    ]  # fmt: skip
    return request(specs, a.tobytes() + b.tobytes(), **extra)


def test_a_remembered_header_decodes_each_requests_own_tensor_bytes() -> None:
    decoder = RequestDecoder({"a": "FP32", "b": "INT64"})
    rng = np.random.default_rng(0)
    decoded = []
    for _ in range(3):  # the same header each time, new tensor bytes
        a = rng.standard_normal((2, 3)).astype(np.float32)
        b = rng.integers(-9, 9, (2,)).astype(np.int64)
        body, length = two_binary_inputs(a, b, id="same", parameters={"binary_data_output": True})
        got = decoder.decode(body, length)
        want = parse_infer_request(body, length, decoder.inputs)
        np.testing.assert_array_equal(got.inputs["a"], a)
        np.testing.assert_array_equal(got.inputs["b"], b)
        assert got.inputs["a"].dtype == np.float32 and got.inputs["b"].dtype == np.int64
        assert (got.id, got.parameters, got.outputs, got.binary_output) == (
            want.id, want.parameters, want.outputs, want.binary_output,
        )  # fmt: skip
        decoded.append(got)
    assert len(decoder._layouts) == 1  # one header, remembered once
    assert not np.shares_memory(decoded[0].inputs["a"], decoded[1].inputs["a"])
    (layout,) = decoder._layouts.values()
    assert layout.request.inputs == {}  # no request's tensors kept alive


def test_a_remembered_header_with_the_wrong_number_of_bytes_is_refused() -> None:
    decoder = RequestDecoder({"a": "FP32", "b": "INT64"})
    a, b = np.zeros((2, 3), np.float32), np.zeros(2, np.int64)
    body, length = two_binary_inputs(a, b)
    decoder.decode(body, length)
    with pytest.raises(ProtocolError, match="binary_data_size 16 does not fit the 8"):
        decoder.decode(body[:-8], length)
    with pytest.raises(ProtocolError, match="take 40 bytes, but 44 follow"):
        decoder.decode(body + b"more", length)
    np.testing.assert_array_equal(decoder.decode(body, length).inputs["b"], b)  # still fine


def test_json_tensors_and_long_headers_are_not_remembered() -> None:
    decoder = RequestDecoder({"x": "FP32"})
    body, length = request([{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}])
    np.testing.assert_array_equal(decoder.decode(body, length).inputs["x"], [[1, 2]])
    long_id = "i" * RequestDecoder.MAX_HEADER_BYTES
    x = np.ones((1, 2), np.float32)
    spec = {"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
    body, length = request([spec], x.tobytes(), id=long_id)
    assert decoder.decode(body, length).id == long_id
    assert not decoder._layouts


def test_the_decoder_remembers_a_bounded_number_of_headers() -> None:
    decoder = RequestDecoder({"x": "FP32"}, size=4)
    x = np.ones((1, 2), np.float32)
    spec = {"name": "x", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
    for index in range(10):
        body, length = request([spec], x.tobytes(), id=str(index))
        assert decoder.decode(body, length).id == str(index)
    assert len(decoder._layouts) == 4


def test_binary_responses_with_a_cached_header_carry_their_own_data() -> None:
    for value in (1.0, 2.0):
        y = np.full((2, 2), value, np.float32)
        labels = np.arange(2, dtype=np.int64)
        content, header = encode_infer_response(
            "m", "1", "r", [("y", y, True), ("labels", labels, True)]
        )
        result = InferResult.from_response_body(content, header_length=header)
        np.testing.assert_array_equal(result.as_numpy("y"), y)
        np.testing.assert_array_equal(result.as_numpy("labels"), labels)
        assert result.get_response()["id"] == "r"
        assert result.get_response()["model_name"] == "m"
