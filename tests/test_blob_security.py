"""Blobs and model-cache entries are untrusted bytes until checked: crafted ones are refused.

The blobs here are real exports, rewritten the way anyone can: parse the framing, edit
the header or the ONNX payload, and recompute the SHA-256 exactly as the format does
(the checksum detects damage, it is no signature). A blob whose tensor names external
data must be refused without the named file ever being opened; a malformed header
raises ``InvalidBlobError``; a bad ``CACHE_DIR`` entry is compiled again and replaced,
whether its bytes are bad or it is no file of its own (a directory, a link, a pipe), and
nothing outside the cache directory is read or written meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import aioinfer as ai
from tests.helpers import make_model, tensor_info

WEIGHT = np.array([0.5, -1.0, 2.0, 4.0], np.float32)
SECRET = np.array([1234.0, 5678.0, 9012.0, 3456.0], np.float32)
"""What the file named by a crafted blob holds: were it read, ``x + SECRET`` comes back."""

X = np.zeros(4, np.float32)

_PREFIX = struct.Struct("<8sHI")
_LENGTH = struct.Struct("<Q")


def _model(weight: np.ndarray = WEIGHT) -> onnx.ModelProto:
    """``y = x + w`` with ``w`` an initializer (the tensor the attacks point elsewhere)."""
    return make_model(
        [oh.make_node("Add", ["x", "w"], ["y"], name="add")],
        [tensor_info("x", np.float32, [4])],
        [tensor_info("y", np.float32, [4])],
        {"w": weight},
    )


# -- the blob format, taken apart and put together by hand ------------------------------


def split_blob(blob: bytes) -> tuple[int, bytes, bytes]:
    """(format version, header, payload) of a blob, read as the format documents it."""
    magic, version, header_size = _PREFIX.unpack_from(blob)
    assert magic == b"AIOINFER"
    header = blob[_PREFIX.size : _PREFIX.size + header_size]
    at = _PREFIX.size + header_size
    (payload_size,) = _LENGTH.unpack_from(blob, at)
    payload = blob[at + _LENGTH.size : at + _LENGTH.size + payload_size]
    return version, header, payload


def join_blob(header: bytes, payload: bytes, version: int = 1, magic: bytes = b"AIOINFER") -> bytes:
    """A blob with a correct checksum around ``header`` and ``payload``."""
    body = b"".join(
        (_PREFIX.pack(magic, version, len(header)), header, _LENGTH.pack(len(payload)), payload)
    )
    return body + hashlib.sha256(body).digest()


def with_payload(blob: bytes, edit: Callable[[onnx.ModelProto], None]) -> bytes:
    version, header, payload = split_blob(blob)
    proto = onnx.ModelProto()
    proto.ParseFromString(payload)
    edit(proto)
    return join_blob(header, proto.SerializeToString(), version)


def with_header(blob: bytes, edit: Callable[[dict[str, Any]], object]) -> bytes:
    version, header, payload = split_blob(blob)
    data = json.loads(header)
    edit(data)
    return join_blob(json.dumps(data).encode(), payload, version)


def with_raw_header(blob: bytes, header: bytes) -> bytes:
    version, _, payload = split_blob(blob)
    return join_blob(header, payload, version)


def _point_at(tensor: onnx.TensorProto, location: str) -> None:
    """Make ``tensor`` keep its bytes in external data at ``location``."""
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        tensor.external_data.add(key=key, value=value)


def _weight_as_external(location: str) -> Callable[[onnx.ModelProto], None]:
    def edit(proto: onnx.ModelProto) -> None:
        (weight,) = [t for t in proto.graph.initializer if t.name == "w"]
        _point_at(weight, location)

    return edit


def _weight_as_external_constant(location: str) -> Callable[[onnx.ModelProto], None]:
    """The weight made by a ``Constant`` node whose value tensor is external."""

    def edit(proto: onnx.ModelProto) -> None:
        (weight,) = [t for t in proto.graph.initializer if t.name == "w"]
        value = onnx.TensorProto()
        value.CopyFrom(weight)
        proto.graph.initializer.remove(weight)
        _point_at(value, location)
        proto.graph.node.insert(0, oh.make_node("Constant", [], ["w"], value=value))

    return edit


def _weight_in_a_subgraph(location: str) -> Callable[[onnx.ModelProto], None]:
    """The weight returned by both branches of an ``If`` whose branches hold it as an
    external initializer of their own."""

    def edit(proto: onnx.ModelProto) -> None:
        (weight,) = [t for t in proto.graph.initializer if t.name == "w"]
        inner = onnx.TensorProto()
        inner.CopyFrom(weight)
        inner.name = "w_inner"
        _point_at(inner, location)
        branch = oh.make_graph(
            [oh.make_node("Identity", ["w_inner"], ["w_branch"])],
            "branch",
            [],
            [tensor_info("w_branch", np.float32, [4])],
            initializer=[inner],
        )
        proto.graph.initializer.remove(weight)
        proto.graph.initializer.append(oh.make_tensor("cond", onnx.TensorProto.BOOL, [], [True]))
        proto.graph.node.insert(
            0, oh.make_node("If", ["cond"], ["w"], then_branch=branch, else_branch=branch)
        )

    return edit


# -- never opening the named file -------------------------------------------------------

_WATCHED: set[str] = set()
_OPENED: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        name = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if any(name.endswith(watched) for watched in _WATCHED):
            _OPENED.append(name)


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one only looks at _WATCHED


@pytest.fixture
def secret_file(tmp_path: Path) -> Iterator[Path]:
    """A file with known bytes; the test fails if anything opens it."""
    path = tmp_path / "secret.bin"
    path.write_bytes(SECRET.tobytes())
    _WATCHED.add(path.name)
    _OPENED.clear()
    yield path
    _WATCHED.discard(path.name)
    assert _OPENED == [], f"the file named by the crafted blob was opened: {_OPENED}"


CRAFTS = [
    pytest.param(_weight_as_external, id="initializer"),
    pytest.param(_weight_as_external_constant, id="constant-attribute"),
    pytest.param(_weight_in_a_subgraph, id="subgraph-initializer"),
]


@pytest.mark.parametrize("craft", CRAFTS)
def test_blob_naming_an_absolute_external_file_is_refused(
    core: ai.Core, secret_file: Path, craft: Callable[[str], Callable[[onnx.ModelProto], None]]
) -> None:
    blob = core.compile_model(_model(), "CPU").export_model()
    crafted = with_payload(blob, craft(str(secret_file)))
    with pytest.raises(ai.InvalidBlobError, match="external data") as info:
        core.import_model(crafted, "CPU")
    assert str(secret_file) in str(info.value)  # names the location ...
    assert "'w" in str(info.value)  # ... and the tensor
    # The genuine blob still imports and computes x + w.
    y = core.import_model(blob, "CPU").create_infer_request().infer_sync({"x": X})["y"]
    np.testing.assert_array_equal(y, X + WEIGHT)


def test_blob_naming_a_relative_external_file_is_refused(
    core: ai.Core, secret_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = secret_file.parent / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)  # "../../secret.bin" is the secret from here
    blob = core.compile_model(_model(), "CPU").export_model()
    crafted = with_payload(blob, _weight_as_external("../../secret.bin"))
    with pytest.raises(ai.InvalidBlobError, match=r"'w' -> '\.\./\.\./secret\.bin'"):
        core.import_model(crafted, "CPU")


def test_external_data_without_the_location_flag_is_refused(
    core: ai.Core, secret_file: Path
) -> None:
    """``external_data`` entries alone (data_location left DEFAULT) are refused too."""

    def edit(proto: onnx.ModelProto) -> None:
        _weight_as_external(str(secret_file))(proto)
        proto.graph.initializer[0].data_location = onnx.TensorProto.DEFAULT

    blob = core.compile_model(_model(), "CPU").export_model()
    with pytest.raises(ai.InvalidBlobError, match="external data"):
        core.import_model(with_payload(blob, edit), "CPU")


# -- malformed headers ------------------------------------------------------------------


def _drop(key: str) -> Callable[[dict[str, Any]], object]:
    return lambda header: header.pop(key)


def _set(key: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda header: header.__setitem__(key, value)


def _set_port(field: str, value: object) -> Callable[[dict[str, Any]], object]:
    return lambda header: header["inputs"][0].__setitem__(field, value)


RAW_HEADERS = [
    pytest.param(b"{", "not JSON", id="truncated-json"),
    pytest.param(b"", "not JSON", id="empty"),
    pytest.param(b'{"device": "\xff\xfe"}', "not JSON", id="invalid-utf8"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "not JSON", id="deeply-nested"),
    pytest.param(b"[1, 2]", "expected an object", id="array"),
    pytest.param(b"null", "expected an object", id="null"),
    pytest.param(b'"CPU"', "expected an object", id="string"),
]


@pytest.mark.parametrize(("header", "words"), RAW_HEADERS)
def test_unparsable_headers_raise_invalid_blob(core: ai.Core, header: bytes, words: str) -> None:
    blob = core.compile_model(_model(), "CPU").export_model()
    with pytest.raises(ai.InvalidBlobError, match=words):
        core.import_model(with_raw_header(blob, header), "CPU")


HEADER_EDITS = [
    *(
        pytest.param(_drop(key), f"no '{key}'", id=f"missing-{key}")
        for key in ("aioinfer_version", "device", "config", "inputs", "outputs")
    ),
    pytest.param(_set("aioinfer_version", 1), "'aioinfer_version'", id="version-int"),
    pytest.param(_set("device", ["CPU"]), "'device'", id="device-list"),
    pytest.param(_set("config", []), "'config'", id="config-list"),
    pytest.param(_set("inputs", {"x": 1}), "'inputs'", id="inputs-object"),
    pytest.param(_set("outputs", None), "'outputs'", id="outputs-null"),
    pytest.param(_set("inputs", [7]), "input port 0", id="port-not-object"),
    pytest.param(_set("inputs", [{}]), "input port 0 has name None", id="port-empty"),
    pytest.param(_set_port("name", 3), "has name 3", id="port-name-int"),
    pytest.param(_set_port("element_type", 999), "element type 999", id="dtype-unknown"),
    pytest.param(_set_port("element_type", "1"), "element type '1'", id="dtype-str"),
    pytest.param(_set_port("element_type", True), "element type True", id="dtype-bool"),
    pytest.param(_set_port("element_type", 0), "element type 0", id="dtype-undefined"),
    pytest.param(_set_port("shape", "4"), "shape '4'", id="shape-str"),
    pytest.param(_set_port("shape", [-1]), r"shape \[-1\]", id="shape-negative"),
    pytest.param(_set_port("shape", [1.5]), r"shape \[1.5\]", id="shape-float"),
    pytest.param(_set_port("kind", "tuple"), "kind 'tuple'", id="kind-unknown"),
    pytest.param(
        lambda h: h["inputs"].append(dict(h["inputs"][0], name="extra")),
        "ports do not match its model",
        id="port-the-model-lacks",
    ),
    pytest.param(
        lambda h: h["outputs"][0].__setitem__("name", "z"),
        "ports do not match its model",
        id="output-renamed",
    ),
]


@pytest.mark.parametrize(("edit", "words"), HEADER_EDITS)
def test_malformed_headers_raise_invalid_blob(
    core: ai.Core, edit: Callable[[dict[str, Any]], object], words: str
) -> None:
    blob = core.compile_model(_model(), "CPU").export_model()
    with pytest.raises(ai.InvalidBlobError, match=words):
        core.import_model(with_header(blob, edit), "CPU")


CONFIG_EDITS = [
    pytest.param({"NO_SUCH_PROPERTY": 1}, "unknown property 'NO_SUCH_PROPERTY'", id="unknown"),
    pytest.param({"NUM_STREAMS": -3}, "invalid value -3 for property 'NUM_STREAMS'", id="value"),
    pytest.param({"PERFORMANCE_HINT": "FASTEST"}, "'PERFORMANCE_HINT'", id="choice"),
    pytest.param({"LOADED_FROM_CACHE": True}, "read-only", id="read-only"),
    pytest.param({"STATEFUL": "auto"}, "STATEFUL 'AUTO'", id="stateful-auto"),
    pytest.param({"STATEFUL": {"x": "y"}}, "STATEFUL", id="stateful-pairs-not-made"),
]


@pytest.mark.parametrize(("changes", "words"), CONFIG_EDITS)
def test_a_blob_config_is_validated_like_a_compile_config(
    core: ai.Core, changes: dict[str, object], words: str
) -> None:
    """A bad config inside a blob is the blob's fault: InvalidBlobError (an
    ImportModelError, like every other bad blob), quoting the property error."""
    blob = core.compile_model(_model(), "CPU").export_model()
    crafted = with_header(blob, lambda h: h["config"].update(changes))
    with pytest.raises(ai.InvalidBlobError, match=words):
        core.import_model(crafted, "CPU")


PAYLOAD_EDITS = [
    pytest.param(
        lambda p: p.graph.node[0].input.__setitem__(0, "nowhere"), "'nowhere'", id="undefined-input"
    ),
    pytest.param(
        lambda p: p.graph.node.append(oh.make_node("Neg", ["x"], ["y"])),
        "'y' is redeclared",
        id="duplicate-output",
    ),
    pytest.param(
        lambda p: p.graph.node[0].__setattr__("op_type", "NoSuchOperator"),
        "cannot be lowered",
        id="unknown-operator",
    ),
]


@pytest.mark.parametrize(("edit", "words"), PAYLOAD_EDITS)
def test_malformed_payloads_raise_invalid_blob(
    core: ai.Core, edit: Callable[[onnx.ModelProto], object], words: str
) -> None:
    blob = core.compile_model(_model(), "CPU").export_model()
    with pytest.raises(ai.InvalidBlobError, match=words):
        core.import_model(with_payload(blob, edit), "CPU")  # type: ignore[arg-type]


# -- CACHE_DIR: a bad entry is compiled again and replaced ------------------------------


def _other_model_blob(core: ai.Core) -> bytes:
    proto = make_model(
        [oh.make_node("Neg", ["a"], ["b"])],
        [tensor_info("a", np.float32, [4])],
        [tensor_info("b", np.float32, [4])],
    )
    return core.compile_model(proto, "CPU").export_model()


ENTRIES: list[Any] = [
    pytest.param(lambda good, core, secret: b"", id="empty"),
    pytest.param(lambda good, core, secret: good[: len(good) // 2], id="truncated"),
    pytest.param(lambda good, core, secret: b"NOTABLOB" + good[8:], id="wrong-magic"),
    pytest.param(lambda good, core, secret: good[:8] + b"\x07\x00" + good[10:], id="format-7"),
    pytest.param(
        lambda good, core, secret: with_header(good, _set("aioinfer_version", "0.0.0")),
        id="other-aioinfer",
    ),
    pytest.param(
        lambda good, core, secret: good[:-50] + bytes([good[-50] ^ 0xFF]) + good[-49:],
        id="checksum-mismatch",
    ),
    pytest.param(
        lambda good, core, secret: with_header(good, _set("device", "GPU")), id="other-device"
    ),
    pytest.param(
        lambda good, core, secret: with_raw_header(good, b'{"device": "CPU", '),
        id="header-not-json",
    ),
    pytest.param(
        lambda good, core, secret: with_header(good, _drop("outputs")), id="header-missing-key"
    ),
    pytest.param(
        lambda good, core, secret: with_header(good, lambda h: h["config"].update(FOO=1)),
        id="config-unknown-property",
    ),
    pytest.param(lambda good, core, secret: _other_model_blob(core), id="another-model"),
    pytest.param(
        lambda good, core, secret: with_payload(good, _weight_as_external(str(secret))),
        id="external-data",
    ),
]


@pytest.mark.parametrize("damage", ENTRIES)
def test_a_bad_cache_entry_is_compiled_again_and_rewritten(
    core: ai.Core,
    tmp_path: Path,
    secret_file: Path,
    damage: Callable[[bytes, ai.Core, Path], bytes],
) -> None:
    cache = tmp_path / "cache"
    config = {"CACHE_DIR": str(cache)}
    core.compile_model(_model(), "CPU", config)
    (entry,) = cache.iterdir()
    good = entry.read_bytes()
    entry.write_bytes(damage(good, core, secret_file))

    compiled = core.compile_model(_model(), "CPU", config)
    assert compiled.get_property("LOADED_FROM_CACHE") is False
    y = compiled.create_infer_request().infer_sync({"x": X})["y"]
    np.testing.assert_array_equal(y, X + WEIGHT)  # exact: one float32 addition
    assert [p.name for p in cache.iterdir()] == [entry.name]  # no stray temporary file
    assert entry.read_bytes() == good  # replaced by a good entry

    again = core.compile_model(_model(), "CPU", config)
    assert again.get_property("LOADED_FROM_CACHE") is True
    np.testing.assert_array_equal(again.create_infer_request().infer_sync({"x": X})["y"], y)


# -- CACHE_DIR: an entry that is no regular file of its own -----------------------------


def _planted_directory(entry: Path, outside: Path) -> None:
    """A directory holding a blob and a link to a file outside (removal must not
    follow it)."""
    entry.mkdir()
    (entry / "blob").write_bytes((outside / "good.blob").read_bytes())
    (entry / "link").symlink_to(outside / "kept.bin")


PLANTED: list[Any] = [
    pytest.param(_planted_directory, id="directory"),
    pytest.param(lambda entry, outside: entry.mkdir(), id="empty-directory"),
    pytest.param(
        lambda entry, outside: entry.symlink_to(outside / "missing.blob"), id="dangling-symlink"
    ),
    # A valid entry of this very model, outside: had the link been followed, it loads.
    pytest.param(
        lambda entry, outside: entry.symlink_to(outside / "good.blob"), id="outward-symlink"
    ),
    pytest.param(lambda entry, outside: entry.symlink_to(outside), id="symlink-to-a-directory"),
    pytest.param(lambda entry, outside: os.link(outside / "good.blob", entry), id="hard-link"),
    pytest.param(lambda entry, outside: os.mkfifo(entry), id="fifo"),  # read: waits forever
]


def _tree(root: Path) -> dict[str, tuple[str, bytes | str, int]]:
    """Each path under ``root``, links not followed: its kind, its bytes (a file) or
    target (a link), and its modification time."""
    tree: dict[str, tuple[str, bytes | str, int]] = {}
    for path in sorted(root.rglob("*")):
        status = path.lstat()
        if stat.S_ISLNK(status.st_mode):
            tree[str(path)] = ("link", os.readlink(path), status.st_mtime_ns)
        elif stat.S_ISDIR(status.st_mode):
            tree[str(path)] = ("directory", "", status.st_mtime_ns)
        else:
            tree[str(path)] = ("file", path.read_bytes(), status.st_mtime_ns)
    return tree


@pytest.mark.parametrize("plant", PLANTED)
def test_an_entry_that_is_no_file_of_its_own_is_replaced_and_never_followed(
    core: ai.Core, tmp_path: Path, plant: Callable[[Path, Path], None]
) -> None:
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    config = {"CACHE_DIR": str(cache)}
    core.compile_model(_model(), "CPU", config)
    (entry,) = cache.iterdir()
    good = entry.read_bytes()
    entry.unlink()
    outside.mkdir()
    (outside / "good.blob").write_bytes(good)
    (outside / "kept.bin").write_bytes(SECRET.tobytes())
    plant(entry, outside)
    before = _tree(outside)

    compiled = core.compile_model(_model(), "CPU", config)
    assert compiled.get_property("LOADED_FROM_CACHE") is False
    y = compiled.create_infer_request().infer_sync({"x": X})["y"]
    np.testing.assert_array_equal(y, X + WEIGHT)  # exact: one float32 addition
    assert _tree(outside) == before  # nothing outside was written (nor created, nor removed)
    status = entry.lstat()
    assert stat.S_ISREG(status.st_mode) and status.st_nlink == 1  # a file of its own now
    assert entry.read_bytes() == good
    assert [p.name for p in cache.iterdir()] == [entry.name]  # no stray temporary file

    again = core.compile_model(_model(), "CPU", config)
    assert again.get_property("LOADED_FROM_CACHE") is True
    np.testing.assert_array_equal(again.create_infer_request().infer_sync({"x": X})["y"], y)
