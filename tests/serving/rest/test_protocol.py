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
    RequestedOutput,
    encode_infer_response,
    parse_infer_request,
    port_metadata,
)
from aioinfer.serving.rest import HTTP_STATUS


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
    assert HTTP_STATUS[caught.value.kind] == 400


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


# -- JSON data: checked, not coerced ---------------------------------------------------------


def json_input(kind: str, data: Any, shape: list[int] | None = None) -> np.ndarray:
    size = len(data) if isinstance(data, list) else 1
    spec = {"name": "x", "shape": shape or [size], "datatype": kind, "data": data}
    body, length = request([spec])
    return parse_infer_request(body, length, {"x": kind}).inputs["x"]


@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        ("INT8", [-128, 127], np.array([-128, 127], np.int8)),
        ("UINT8", [0, 255], np.array([0, 255], np.uint8)),
        ("INT64", [-(2**63), 2**63 - 1], np.array([-(2**63), 2**63 - 1], np.int64)),
        ("UINT64", [0, 2**64 - 1], np.array([0, 2**64 - 1], np.uint64)),
        ("UINT64", [2**63 + 1, 1], np.array([2**63 + 1, 1], np.uint64)),  # numpy: float64
        ("UINT64", [2**63 + 1], np.array([2**63 + 1], np.uint64)),  # numpy: uint64
        ("INT64", [1.0, 2**60 + 1], np.array([1, 2**60 + 1], np.int64)),  # numpy: float64
        ("INT16", [1.0, -3.0], np.array([1, -3], np.int16)),  # integral floats are integers
        ("FP16", [65504, -1], np.array([65504, -1], np.float16)),
        ("FP64", [1e308, 5e-324], np.array([1e308, 5e-324], np.float64)),
        ("BOOL", [True, False], np.array([True, False])),
        ("FP32", [], np.zeros(0, np.float32)),
        ("INT8", [], np.zeros(0, np.int8)),
    ],
)
def test_json_values_within_range_are_exact(kind: str, data: Any, expected: np.ndarray) -> None:
    got = json_input(kind, data)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("kind", "data", "message"),
    [
        ("INT8", [1, 128], "element 1 of 'data' is 128, out of the range of INT8 [-128, 127]"),
        ("UINT8", [-1], "is -1, out of the range of UINT8 [0, 255]"),
        ("UINT64", [2**64], "is 18446744073709551616, out of the range of UINT64"),
        ("INT64", [2**63], "is 9223372036854775808, out of the range of INT64"),
        ("INT64", [-1, 2**63], "out of the range of INT64"),  # numpy reads float64
        ("INT32", [10**400], "is 10000000000000000000... (401 digits), out of the range"),
        ("INT8", [0.5], "is 0.5, not an integer (INT8)"),
        ("INT8", ["1"], 'is "1", not an integer (INT8)'),
        ("INT8", [None, 1], "is null, not an integer"),
        ("FP32", [3.5e38], "is 3.5e+38, out of the range of FP32"),
        ("FP16", ["NaN", 65520.0], "is 65520.0, out of the range of FP16"),
        ("FP64", [1, 10**400], "element 1 of 'data' is 1000000000000000000"),
        ("FP32", ["nan"], 'is "nan", not a number, "NaN", "Infinity" or "-Infinity" (FP32)'),
        ("FP32", [{"a": 1}], "is {'a': 1}, not a number"),
        ("BOOL", [True, 1], "element 1 of 'data' is 1, not true or false (BOOL)"),
        ("BOOL", [0], "is 0, not true or false"),
        ("BYTES", [["a"], [None]], "element 1 of 'data' is null, not a string (BYTES)"),
    ],
)
def test_json_values_that_do_not_fit_are_refused(kind: str, data: Any, message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        json_input(kind, data)
    assert "input 'x': " in str(caught.value)
    assert message in str(caught.value)
    assert HTTP_STATUS[caught.value.kind] == 400


def test_special_floats_are_strings_both_ways() -> None:
    values = json_input("FP32", ["NaN", 1.5, "Infinity", "-Infinity"])
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, [np.nan, 1.5, np.inf, -np.inf])
    # The bare literals of Python's json (and Triton) read the same.
    spec = b'{"name": "x", "shape": [3], "datatype": "FP64", "data": [NaN, Infinity, -Infinity]}'
    literal = b'{"inputs": [' + spec + b"]}"
    parsed = parse_infer_request(literal, None, {"x": "FP64"}).inputs["x"]
    np.testing.assert_array_equal(parsed, [np.nan, np.inf, -np.inf])
    for dtype in (np.float16, np.float32, np.float64):
        array = np.array([[np.nan, -np.inf], [np.inf, 0.25]], dtype)
        content, header = encode_infer_response("m", "1", None, [("y", array, False)])
        assert header is None

        def refuse(literal: str) -> None:
            raise AssertionError(f"{literal} in the response")

        output = json.loads(content, parse_constant=refuse)["outputs"][0]
        assert output["data"] == ["NaN", "-Infinity", "Infinity", 0.25]
        result = InferResult.from_response_body(content)
        np.testing.assert_array_equal(result.as_numpy("y"), array)


def test_bytes_outputs_that_are_not_utf8_cannot_be_json() -> None:
    words = np.array([b"fine", b"\xc3\x28"], dtype=object)
    with pytest.raises(ProtocolError, match=r"output 'w': element 1 \(b'\\xc3\('\) is not UTF-8"):
        encode_infer_response("m", "1", None, [("w", words, False)])
    content, header = encode_infer_response("m", "1", None, [("w", words, True)])
    result = InferResult.from_response_body(content, header_length=header)
    assert result.as_numpy("w").tolist() == [b"fine", b"\xc3\x28"]


def test_shapes_and_header_lengths_are_bounded() -> None:
    with pytest.raises(ProtocolError, match="has 33 dimensions, at most 32"):
        json_input("FP32", [1.0], shape=[1] * 33)
    assert json_input("FP32", [1.0], shape=[1] * 32).shape == (1,) * 32
    with pytest.raises(ProtocolError, match=r"'shape' \[0, 4611686018427387904, 2\] is too large"):
        json_input("FP32", [], shape=[0, 2**62, 2])
    body, _ = request([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}])
    decoder = RequestDecoder({"x": "FP32"})
    for length in ("9" * 19, "-1", "+5", "1_0", "\u0663"):
        with pytest.raises(ProtocolError, match="must be a byte count"):
            decoder.decode(body, length)
    with pytest.raises(ProtocolError, match="nests arrays or objects too deeply"):
        decoder.decode(b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", None)


def test_empty_outputs_means_every_output() -> None:
    body, length = request([dict(FP32, data=[1, 2])], outputs=[])
    assert parse_infer_request(body, length, {"x": "FP32"}).outputs is None
    body, length = request([dict(FP32, data=[1, 2])], outputs=[{"name": "y"}])
    assert parse_infer_request(body, length, {"x": "FP32"}).outputs == [RequestedOutput("y", False)]
