"""The ORT device: onnxruntime behind the request pipeline.

Results equal a plain onnxruntime session's; a cancel stops the compute (not only the
waiting); hints and properties become session options; bad input fails as on CPU;
PERF_COUNT reads node timings from onnxruntime's profile; BATCH:ORT, PROCESS:ORT and
``aioinfer serve`` with ``"device": "ORT"`` run it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import signal
import statistics
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import sniffio
import tritonclient.http as httpclient

import aioinfer as ai
from aioinfer.devices.ort.plugin import MULTI_STREAM_INLINE_S
from aioinfer.devices.ort.session import SPIN_US
from aioinfer.models import default_model_path
from aioinfer.plugin.blob import dump, load
from aioinfer.properties import num_cores
from tests.helpers import (
    assert_inline_runs_share_the_loop,
    chain_model,
    make_model,
    mlp_model,
    reference_outputs,
    reshape_model,
    tensor_info,
    two_input_model,
)
from tests.serving.test_cli_serve import start, wait_for

WIDTH = 384


def long_model() -> onnx.ModelProto:
    """800 small kernels: a run of tens to hundreds of ms, stoppable between kernels."""
    return chain_model(400, WIDTH)


def rows(count: int, seed: int = 0, width: int = WIDTH) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width)).astype(np.float32)


def gelu_model() -> onnx.ModelProto:
    """``y = Gelu(x @ w)`` with com.microsoft's Gelu: onnxruntime runs it, CPU does not."""
    w = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        oh.make_node("Gelu", ["h"], ["y"], name="gelu", domain="com.microsoft"),
    ]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, ["batch", 4])],
        [tensor_info("y", np.float32, ["batch", 4])],
        {"w": w},
        name="gelu",
        opsets={"": 18, "com.microsoft": 1},
    )


def gelu_reference(x: np.ndarray) -> np.ndarray:
    """numpy: GELU with the exact erf."""
    w = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
    h = x.astype(np.float64) @ w.astype(np.float64)
    return 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))


def same_session(compiled: ai.CompiledModel, model: onnx.ModelProto) -> ort.InferenceSession:
    """A plain onnxruntime session with the options the compiled model's session has."""
    used = compiled.session.get_session_options()  # type: ignore[attr-defined]
    options = ort.SessionOptions()
    options.intra_op_num_threads = used.intra_op_num_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


# -- results ----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT"])
async def test_results_equal_a_plain_session_run(core, hint):
    cnn = onnx.load(default_model_path())
    image = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    cases = [(mlp_model(), {"x": rows(5, width=4)}), (cnn, {"image": image})]
    cases.append((two_input_model(), {"a": rows(2, 1, 3), "b": rows(2, 2, 3)}))
    cases[-1][1]["scale"] = np.array([1, 2, 3], np.int64)
    for model, feed in cases:
        compiled = core.compile_model(model, "ORT", {"PERFORMANCE_HINT": hint})
        expected = same_session(compiled, model).run(None, feed)
        request = compiled.create_infer_request()
        results = await request.infer(feed)
        assert list(results) == [o.name for o in model.graph.output]
        for index, want in enumerate(expected):
            np.testing.assert_array_equal(results[index], want)
            assert results[index].dtype == want.dtype
        # The arrays are the caller's: the next run does not write into them.
        kept = results[0].copy()
        await request.infer(feed)
        np.testing.assert_array_equal(results[0], kept)


async def _infer_once(compiled: ai.CompiledModel, feed: dict[str, np.ndarray]) -> ai.InferResults:
    return await compiled.create_infer_request().infer(feed)


@pytest.mark.anyio
async def test_external_data_stays_external(core, tmp_path):
    model = mlp_model(in_features=64, out_features=32)
    saved = mlp_model(in_features=64, out_features=32)  # saving moves its weights out
    onnx.save(saved, tmp_path / "m.onnx", save_as_external_data=True, location="weights.bin")
    assert (tmp_path / "weights.bin").stat().st_size >= 64 * 32 * 4
    assert os.path.getsize(tmp_path / "m.onnx") < 2000
    compiled = core.compile_model(core.read_model(tmp_path / "m.onnx"), "ORT")
    x = rows(3, width=64)
    results = await _infer_once(compiled, {"x": x})
    for got, want in zip(results.to_tuple(), reference_outputs(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.anyio
async def test_an_operator_only_onnxruntime_has(core):
    x = rows(3, width=4)
    results = await _infer_once(core.compile_model(gelu_model(), "ORT"), {"x": x})
    np.testing.assert_allclose(results["y"], gelu_reference(x), rtol=1e-4, atol=1e-5)
    assert core.query_model(gelu_model(), "ORT") == {"matmul": "ORT", "gelu": "ORT"}
    assert core.query_model(gelu_model(), "CPU") == {"matmul": "CPU"}
    with pytest.raises(ai.UnsupportedOperatorError):
        core.compile_model(gelu_model(), "CPU")


def test_the_compiled_model_does_not_keep_the_weights_aioinfer_read(core):
    model = core.read_model(mlp_model(in_features=256, out_features=256).SerializeToString())
    read = weakref.ref(model.ir.graph)
    compiled = core.compile_model(model, "ORT")
    del model
    gc.collect()
    assert read() is None  # onnxruntime's session holds the only copy
    assert compiled.get_property("NETWORK_NAME") == "mlp"
    assert compiled.create_infer_request().infer_sync([rows(2, width=256)])["y"].shape == (2, 256)


def test_query_model_leaves_out_operators_without_a_kernel(core):
    model = make_model(
        [
            oh.make_node("Relu", ["x"], ["r"], name="relu"),
            oh.make_node("Nope", ["r"], ["y"], name="nope", domain="com.example"),
        ],
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
        opsets={"": 18, "com.example": 1},
    )
    assert core.query_model(model, "ORT") == {"relu": "ORT"}
    with pytest.raises(ai.CompileError, match="'test_model'"):
        core.compile_model(model, "ORT")


def test_query_model_counts_what_onnxruntime_folds_or_inlines(core):
    """A Constant node (an initializer once onnxruntime loads the graph) and HardSwish
    and Mish (ONNX functions onnxruntime inlines: it has no kernel for them) have no
    kernel in onnxruntime's table, yet run: the query lists them, and the model runs."""
    model = make_model(
        [
            oh.make_node(
                "Constant", [], ["c"], name="const", value=oh.make_tensor("v", 1, [2], [3, -3])
            ),
            oh.make_node("Add", ["x", "c"], ["a"], name="add"),
            oh.make_node("HardSwish", ["a"], ["h"], name="hardswish"),
            oh.make_node("Mish", ["h"], ["y"], name="mish"),
        ],
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
        opsets={"": 18},
    )
    assert core.query_model(model, "ORT") == dict.fromkeys(
        ["const", "add", "hardswish", "mish"], "ORT"
    )
    x = np.array([0.5, 1.0], np.float32)
    a = x + np.array([3, -3], np.float32)
    h = a * np.clip(a / 6 + 0.5, 0, 1)
    expected = h * np.tanh(np.log1p(np.exp(h)))
    y = core.compile_model(model, "ORT").create_infer_request().infer_sync({"x": x})["y"]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


# -- cancellation ----------------------------------------------------------------------


async def _full_run(compiled: ai.CompiledModel, x: np.ndarray) -> float:
    """The median of three runs after a warm-up: the control a cancel is compared with."""
    request = compiled.create_infer_request()
    await request.infer({"x": x})
    times = []
    for _ in range(3):
        start = time.perf_counter()
        await request.infer({"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@pytest.mark.anyio
async def test_cancelling_the_task_stops_the_compute_and_the_request_is_reusable(core):
    model = long_model()
    compiled = core.compile_model(model, "ORT")
    x = rows(256)
    full = await _full_run(compiled, x)
    request = compiled.create_infer_request()
    start = time.perf_counter()
    with anyio.move_on_after(full / 10) as scope:
        await request.infer({"x": x})
    cancelled_after = time.perf_counter() - start
    assert scope.cancelled_caught
    # The executor waits until the stage let go: a run left to finish would take ~full.
    assert cancelled_after < full / 2, (cancelled_after, full)
    assert isinstance(request.error, ai.InferCancelledError)
    # Reusable at once: the terminate flag is cleared before the next run.
    small = rows(2, seed=5)
    results = await request.infer({"x": small})
    np.testing.assert_allclose(
        results["y"], reference_outputs(model, {"x": small})[0], rtol=1e-4, atol=1e-5
    )


@pytest.mark.anyio
async def test_cancel_stops_only_that_request(core):
    model = long_model()
    compiled = core.compile_model(model, "ORT", {"NUM_STREAMS": 2})
    x = rows(128)
    full = await _full_run(compiled, x)
    stopped, running = compiled.create_infer_request(), compiled.create_infer_request()
    stopped.start_async({"x": x})
    running.start_async({"x": x})
    await anyio.sleep(full / 10)
    start = time.perf_counter()
    stopped.cancel()
    with pytest.raises(ai.InferCancelledError, match="cancelled"):
        await stopped.wait()
    assert time.perf_counter() - start < full / 2
    results = await running.wait()
    assert results is not None and running.error is None
    np.testing.assert_allclose(
        results["y"], reference_outputs(model, {"x": x})[0], rtol=1e-4, atol=1e-5
    )
    assert (await stopped.infer({"x": rows(1)}))["y"].shape == (1, WIDTH)


def conv_model(layers: int = 12, channels: int = 64, size: int = 56) -> onnx.ModelProto:
    """(Conv 3x3 + Relu) x ``layers`` on ``channels`` x ``size`` x ``size``: a run of
    tens of milliseconds whose kernels, each split between the intra-op threads, take a
    few percent of it (ResNet's middle layers)."""
    rng = np.random.default_rng(4)
    weights, nodes, last = {}, [], "x"
    for i in range(layers):
        weights[f"w{i}"] = (rng.standard_normal((channels, channels, 3, 3)) / 24).astype(np.float32)
        nodes.append(oh.make_node("Conv", [last, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        last = "y" if i == layers - 1 else f"r{i}"
        nodes.append(oh.make_node("Relu", [f"c{i}"], [last]))
    shape = [1, channels, size, size]
    return make_model(
        nodes,
        [tensor_info("x", np.float32, shape)],
        [tensor_info("y", np.float32, shape)],
        weights,
        name="convs",
    )


@pytest.mark.anyio
async def test_a_cancel_mid_run_returns_within_a_kernel_or_so(core):
    """Cancelled 20-60% into a run of kernels split between the (spinning) intra-op
    threads, the awaiting task gets control back long before the run would have ended:
    onnxruntime sees the terminate flag at the next kernel. The control is the run's own
    duration, measured alongside."""
    compiled = core.compile_model(conv_model(), "ORT")
    request = compiled.create_infer_request()
    feed = {"x": np.random.default_rng(5).standard_normal((1, 64, 56, 56)).astype(np.float32)}
    await request.infer(feed)
    fractions = []
    for trial in range(6):
        start = time.perf_counter()
        await request.infer(feed)
        full = time.perf_counter() - start
        cancelled_at = 0.0
        with anyio.CancelScope() as scope:

            async def cancel_later(after: float = full * (0.2 + 0.08 * trial)) -> None:
                nonlocal cancelled_at
                await anyio.sleep(after)
                cancelled_at = time.perf_counter()
                scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(cancel_later)
                await request.infer(feed)
        if cancelled_at and isinstance(request.error, ai.InferCancelledError):
            fractions.append((time.perf_counter() - cancelled_at) / full)
    assert len(fractions) >= 3, fractions  # most cancels land before the run ends
    assert statistics.median(fractions) < 0.25, fractions


def test_a_cancel_before_the_run_stops_it_at_the_first_kernel(core):
    compiled = core.compile_model(long_model(), "ORT")
    request = compiled.create_infer_request()
    sync = request._request
    sync.set_inputs({"x": rows(4)})
    sync.cancel()  # as the worker of PROCESS does: the token and the flag set, then run
    with pytest.raises(ai.InferCancelledError):
        sync.run_stages()
    assert request.infer_sync({"x": rows(2)})["y"].shape == (2, WIDTH)


# -- properties and session options ----------------------------------------------------


def _intra(compiled: ai.CompiledModel) -> int:
    return int(compiled.session.get_session_options().intra_op_num_threads)  # type: ignore[attr-defined]


def _spinning(compiled: ai.CompiledModel) -> str:
    options = compiled.session.get_session_options()  # type: ignore[attr-defined]
    return str(options.get_session_config_entry("session.intra_op.allow_spinning"))


def _spin_us(compiled: ai.CompiledModel) -> str:
    options = compiled.session.get_session_options()  # type: ignore[attr-defined]
    try:
        return str(options.get_session_config_entry("session.intra_op.spin_duration_us"))
    except RuntimeError:  # not set: onnxruntime's own spinning, if any
        return ""


_TASKS = Path(f"/proc/{os.getpid()}/task")


def _threads() -> set[str]:
    """The ids of this process's threads (Linux)."""
    return {task.name for task in _TASKS.iterdir()}


def _sleeps_and_cpu(threads: set[str]) -> tuple[int, int]:
    """How many times ``threads`` went to sleep so far, and their CPU time (ns)."""
    sleeps = cpu = 0
    for thread in threads:
        try:
            status = (_TASKS / thread / "status").read_text()
            schedstat = (_TASKS / thread / "schedstat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        sleeps += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        cpu += int(schedstat.split()[0])
    return sleeps, cpu


@pytest.mark.skipif(
    num_cores() < 2 or not _TASKS.is_dir(),
    reason="Linux, 2 cores",
)
def test_intra_op_threads_stay_awake_through_a_run_and_sleep_after_it(core):
    """Spinning off, onnxruntime's intra-op thread sleeps after each parallel section and
    the next one must wake it (tens of microseconds each on a virtual machine: most of
    what made ORT slower than onnxruntime's defaults). By default it stays awake
    through a run, but does not spin on for milliseconds after it as onnxruntime's own
    default does (the control: a session with onnxruntime's defaults). Counted on each
    session's own pool threads (those its creation started)."""
    model = chain_model(100, WIDTH)  # 200 kernels, most split between the threads
    feed = {"x": rows(64)}
    makers = {
        "default": lambda: core.compile_model(model, "ORT").session,
        "off": lambda: core.compile_model(model, "ORT", {"ORT_ALLOW_SPINNING": False}).session,
        "onnxruntime": lambda: ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        ),
    }
    sessions, pools = {}, {}
    for name, make in makers.items():
        before = _threads()
        sessions[name] = make()
        pools[name] = _threads() - before
        assert pools[name], f"{name}: no intra-op pool thread"
    sleeps: dict[str, list[float]] = {name: [] for name in sessions}
    after: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(3):  # alternating: load from other processes hits all alike
        for name, session in sessions.items():
            session.run(None, feed)
            slept, _ = _sleeps_and_cpu(pools[name])
            for _ in range(5):
                session.run(None, feed)
            ended, cpu = _sleeps_and_cpu(pools[name])
            sleeps[name].append((ended - slept) / 5)
            time.sleep(0.05)  # what the pool's threads burn once the runs stopped
            after[name].append(_sleeps_and_cpu(pools[name])[1] - cpu)
    # On a loaded machine the spinning threads are descheduled too and sleep more (the
    # default measured two thirds of spinning off at a load of 10): the least of each
    # turn is the one load spoiled least.
    default, off = min(sleeps["default"]), min(sleeps["off"])
    assert default < off * 0.8, sleeps
    assert statistics.median(after["default"]) < statistics.median(after["onnxruntime"]) / 4, after


def test_hints_and_threads_become_session_options(core):
    model = mlp_model()
    cores = num_cores()
    latency = core.compile_model(model, "ORT", {"PERFORMANCE_HINT": "LATENCY"})
    assert (latency.get_property("NUM_STREAMS"), _intra(latency)) == (1, cores)
    assert latency.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 1
    throughput = core.compile_model(model, "ORT", {"PERFORMANCE_HINT": "THROUGHPUT"})
    assert (throughput.get_property("NUM_STREAMS"), _intra(throughput)) == (cores, 1)
    assert throughput.task_executor.workers == cores
    assert throughput.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 2 * cores
    explicit = core.compile_model(model, "ORT", {"NUM_STREAMS": 2, "INFERENCE_NUM_THREADS": 6})
    assert (explicit.get_property("NUM_STREAMS"), _intra(explicit)) == (2, 3)
    assert explicit.get_property("INFERENCE_NUM_THREADS") == 6
    # Spinning by default, for at most SPIN_US after the last work (see the next test).
    assert (_spinning(latency), _spin_us(latency)) == ("1", str(SPIN_US))
    assert latency.get_property("ORT_ALLOW_SPINNING") is True
    still = core.compile_model(model, "ORT", {"ORT_ALLOW_SPINNING": "NO"})
    assert (_spinning(still), _spin_us(still)) == ("0", "")
    assert still.get_property("ORT_ALLOW_SPINNING") is False
    assert latency.get_property("ORT_PROVIDERS") == ("CPUExecutionProvider",)
    assert latency.get_property("DEVICE_NAME") == "ORT"
    assert latency.get_property("NETWORK_NAME") == "mlp"
    assert core.get_property("ORT", "NUM_CORES") == cores
    assert "ORT_PROVIDERS" in core.get_property("ORT", "SUPPORTED_PROPERTIES")


def test_invalid_properties_are_refused(core):
    model = mlp_model()
    with pytest.raises(ai.UnknownPropertyError, match=r"'NO_SUCH'; supported: .*ORT_PROVIDERS"):
        core.compile_model(model, "ORT", {"NO_SUCH": 1})
    with pytest.raises(ai.InvalidPropertyValueError, match="'NoSuchExecutionProvider' not"):
        core.compile_model(model, "ORT", {"ORT_PROVIDERS": "NoSuchExecutionProvider"})
    with pytest.raises(ai.InvalidPropertyValueError, match="ORT_PROVIDERS"):
        core.compile_model(model, "ORT", {"ORT_PROVIDERS": []})


# -- export, import and the model cache -----------------------------------------------


def _payload_model(blob: bytes) -> tuple[dict, onnx.ModelProto]:
    """The ORT payload of a blob taken apart: its JSON header and its ONNX model."""
    payload = bytes(load(blob, "ORT").payload)
    (size,) = struct.unpack_from("<I", payload)
    return json.loads(payload[4 : 4 + size]), onnx.load_from_string(payload[4 + size :])


def _with_payload(blob: bytes, meta: dict | bytes, model: onnx.ModelProto | bytes) -> bytes:
    """``blob`` with another ORT payload, framed with a correct checksum."""
    exported = load(blob, "ORT")
    raw_meta = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    raw_model = model if isinstance(model, bytes) else model.SerializeToString()
    payload = struct.pack("<I", len(raw_meta)) + raw_meta + raw_model
    return dump(dataclasses.replace(exported, payload=payload))


@pytest.mark.anyio
async def test_export_holds_the_optimized_graph_and_imports_to_the_same_results(core):
    cnn = onnx.load(default_model_path())
    compiled = core.compile_model(cnn, "ORT", {"NUM_STREAMS": 2, "PERFORMANCE_HINT": "THROUGHPUT"})
    blob = compiled.export_model()
    meta, optimized = _payload_model(blob)
    assert meta == {"onnxruntime": ort.__version__}
    ops = {(node.domain, node.op_type) for node in optimized.graph.node}
    # onnxruntime's fusions (Conv + Relu) are in it; its machine-specific layout is not.
    assert ("com.microsoft", "FusedConv") in ops
    assert not any(domain == "com.microsoft.nchwc" for domain, _ in ops)
    imported = core.import_model(blob, "ORT", {"NUM_STREAMS": 1, "ORT_ALLOW_SPINNING": True})
    assert imported.get_property("NUM_STREAMS") == 1
    assert imported.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert imported.get_property("ORT_PROVIDERS") == ("CPUExecutionProvider",)
    assert imported.get_property("ORT_ALLOW_SPINNING") is True
    assert imported.get_property("NETWORK_NAME") == "tiny_cnn"
    assert [str(p) for p in imported.inputs] == [str(p) for p in compiled.inputs]
    assert [str(p) for p in imported.outputs] == [str(p) for p in compiled.outputs]
    image = np.random.default_rng(4).standard_normal((3, 3, 32, 32)).astype(np.float32)
    got = await _infer_once(imported, {"image": image})
    for value, want in zip(got.to_tuple(), reference_outputs(cnn, {"image": image}), strict=True):
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ai.InvalidPropertyValueError, match="ORT_PROVIDERS cannot be set"):
        core.import_model(blob, "ORT", {"ORT_PROVIDERS": ["CPUExecutionProvider"]})


def test_the_model_cache_loads_the_second_compile(core, tmp_path):
    config = {"CACHE_DIR": str(tmp_path), "PERFORMANCE_HINT": "THROUGHPUT"}
    first = core.compile_model(mlp_model(), "ORT", config)
    assert first.get_property("LOADED_FROM_CACHE") is False
    (entry,) = tmp_path.iterdir()
    second = core.compile_model(mlp_model(), "ORT", config)
    assert second.get_property("LOADED_FROM_CACHE") is True
    assert second.get_property("NUM_STREAMS") == first.get_property("NUM_STREAMS")
    x = rows(3, width=4)
    got = second.create_infer_request().infer_sync({"x": x})
    for value, want in zip(got.to_tuple(), reference_outputs(mlp_model(), {"x": x}), strict=True):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]
    assert "EXPORT_IMPORT" in core.get_property("ORT", "OPTIMIZATION_CAPABILITIES")
    assert "EXPORT_IMPORT" in first.get_property("OPTIMIZATION_CAPABILITIES")


def test_a_blob_naming_external_data_is_refused_before_onnxruntime_reads_it(core, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(16, 1234.0, np.float32).tobytes())
    blob = core.compile_model(mlp_model(), "ORT").export_model()
    meta, model = _payload_model(blob)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.ClearField("float_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", str(secret)), ("offset", "0"), ("length", "64")):
        weight.external_data.add(key=key, value=value)
    with pytest.raises(ai.InvalidBlobError, match="external data") as caught:
        core.import_model(_with_payload(blob, meta, model), "ORT")
    assert str(secret) in str(caught.value) and repr(weight.name) in str(caught.value)


def test_a_blob_of_another_onnxruntime_version_is_refused(core):
    blob = core.compile_model(mlp_model(), "ORT").export_model()
    _, model = _payload_model(blob)
    older = _with_payload(blob, {"onnxruntime": "1.0.0"}, model)
    with pytest.raises(ai.BlobVersionError, match=f"1.0.0, this is onnxruntime {ort.__version__}"):
        core.import_model(older, "ORT")


def _unknown_op(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.node[0].op_type = "NoSuchOperator"
    return model


def _renamed_input(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.input[0].name = "other"
    for node in model.graph.node:
        node.input[:] = ["other" if name == "x" else name for name in node.input]
    return model


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda meta, model: (b"{not json", model), "header is not JSON"),
        (lambda meta, model: ({"version": 1}, model), r"expected \{\"onnxruntime\""),
        (lambda meta, model: (meta, b"\xff\xff garbage"), "does not parse"),
        (lambda meta, model: (meta, _unknown_op(model)), "does not load.*NoSuchOperator"),
        (lambda meta, model: (meta, _renamed_input(model)), r"inputs \['other'\].*\['x'\]"),
    ],
    ids=["meta-not-json", "meta-fields", "model-garbage", "unknown-operator", "other-inputs"],
)
def test_malformed_ort_payloads_raise_invalid_blob(core, edit, words):
    blob = core.compile_model(mlp_model(), "ORT").export_model()
    crafted = _with_payload(blob, *edit(*_payload_model(blob)))
    with pytest.raises(ai.InvalidBlobError, match=words):
        core.import_model(crafted, "ORT")
    truncated = dump(dataclasses.replace(load(blob, "ORT"), payload=b"\x10\x00"))
    with pytest.raises(ai.InvalidBlobError, match="ORT payload has 2 bytes"):
        core.import_model(truncated, "ORT")


def _nice_values() -> dict[int, int]:
    """Native thread id -> nice value, for every thread of this process (Linux)."""
    values = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                values[int(tid)] = int(stat.read().rsplit(")", 1)[1].split()[16])
        except FileNotFoundError:  # the thread ended since the listing
            continue
    return values


@pytest.mark.anyio
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread nice: Linux")
async def test_thread_nice_lowers_the_priority_of_the_compute_threads_only(core):
    base = os.getpriority(os.PRIO_PROCESS, 0)
    before = _nice_values()
    config = {"ORT_THREAD_NICE": 5, "NUM_STREAMS": 2, "INFERENCE_NUM_THREADS": 4}
    compiled = core.compile_model(mlp_model(), "ORT", config)
    assert compiled.get_property("ORT_THREAD_NICE") == 5
    # onnxruntime's intra-op pool, started by the session: 2 threads per stream.
    pool = {tid: nice for tid, nice in _nice_values().items() if tid not in before}
    assert pool and set(pool.values()) == {base + 5}
    x = rows(2, width=4)
    results = await _infer_once(compiled, {"x": x})
    np.testing.assert_allclose(results["y"], reference_outputs(mlp_model(), {"x": x})[0], rtol=1e-5)
    (task,) = [
        t
        for t in threading.enumerate()
        if t.name.startswith("aioinfer-ORT-task") and t.native_id not in before
    ]
    assert _nice_values()[task.native_id] == base + 5  # the thread that calls session.run
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the loop's thread is untouched
    await compiled.close()
    for value in (-1, 20, "high"):
        with pytest.raises(ai.InvalidPropertyValueError, match="ORT_THREAD_NICE"):
            core.compile_model(mlp_model(), "ORT", {"ORT_THREAD_NICE": value})


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "inputs",
    [
        {"image": rows(2, width=4)},
        {"x": rows(2, width=4).astype(np.float64)},
        {"x": rows(2, width=5)},
        {"x": rows(2, width=4)[0]},
        [rows(2, width=4), rows(2, width=4)],
        {},
    ],
)
def test_bad_inputs_fail_as_on_cpu(core, inputs):
    def failure(device: str) -> tuple[type, str]:
        request = core.compile_model(mlp_model(), device).create_infer_request()
        with pytest.raises(ai.InputError) as caught:
            request.infer_sync(inputs)
        return type(caught.value), str(caught.value)

    assert failure("ORT") == failure("CPU")


def test_a_failing_run_names_the_model_and_the_node(core):
    request = core.compile_model(reshape_model(), "ORT").create_infer_request()
    values = np.arange(6, dtype=np.float32)
    with pytest.raises(ai.InferenceError, match=r"model 'reshape'.*'reshape_node'") as caught:
        request.infer_sync({"x": values, "shape": np.array([4, 4], np.int64)})
    assert "[ONNXRuntimeError]" not in str(caught.value)
    assert request.infer_sync({"x": values, "shape": np.array([3, 2], np.int64)})["y"].shape == (
        3,
        2,
    )


# -- PERF_COUNT ------------------------------------------------------------------------


def _nodes(request: ai.AsyncInferRequest) -> list[dict]:
    return [e for e in request.get_profiling_info() if e["type"] == "node"]


@pytest.mark.anyio
async def test_perf_count_gives_the_node_timings_of_each_run(core):
    model = chain_model(3, 64)
    compiled = core.compile_model(model, "ORT", {"PERF_COUNT": True, "NUM_STREAMS": 2})
    directory = Path(compiled.profiler.directory)  # type: ignore[attr-defined]
    a, b = compiled.create_infer_request(), compiled.create_infer_request()
    for _ in range(3):  # concurrent runs: each request gets the nodes of its own run
        a.start_async({"x": rows(4, width=64)})
        b.start_async({"x": rows(64, width=64)})
        await a.wait()
        await b.wait()
    for request in (a, b):
        nodes = _nodes(request)
        # Identity is optimised away by onnxruntime; 3 MatMul and 3 Tanh ran once each.
        assert sorted(e["op_type"] for e in nodes) == ["MatMul"] * 3 + ["Tanh"] * 3
        assert {e["name"] for e in nodes} >= {"matmul0", "tanh2"}
        assert all(e["execution_type"] == "native" and e["seconds"] >= 0 for e in nodes)
        stages = [e["name"] for e in request.get_profiling_info() if e["type"] == "stage"]
        assert stages == ["preprocess", "start", "wait", "postprocess"]
    # Reading the profile retired the session: the next run is profiled on a new one.
    await a.infer({"x": rows(1, width=64)})
    assert len(_nodes(a)) == 6
    assert len(_nodes(b)) == 6  # b's timings were read before: kept
    await compiled.close()
    assert not directory.exists()


def test_perf_count_off_profiles_nothing(core):
    compiled = core.compile_model(chain_model(3, 64), "ORT")
    request = compiled.create_infer_request()
    request.infer_sync({"x": rows(2, width=64)})
    assert compiled.profiler is None  # type: ignore[attr-defined]
    assert compiled.session.get_session_options().enable_profiling is False  # type: ignore[attr-defined]
    assert [e["type"] for e in request.get_profiling_info()] == ["stage"] * 4


# -- the event loop ---------------------------------------------------------------------


async def _ticker_delays(work) -> list[float]:
    delays: list[float] = []
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = time.perf_counter()
            await anyio.sleep(0.001)
            delays.append(time.perf_counter() - start - 0.001)

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        await work()
        done.set()
    return delays


@pytest.mark.anyio
async def test_the_loop_stays_as_responsive_as_with_plain_threads(core):
    """The control runs the same session on four plain threads (``to_thread``): the loop
    must not lag more with the ORT device computing the same inferences."""
    model = chain_model(200, WIDTH)
    compiled = core.compile_model(model, "ORT")
    session = compiled.session  # type: ignore[attr-defined]
    x = rows(64)

    async def device() -> None:
        requests = [compiled.create_infer_request() for _ in range(4)]
        for request in requests:
            request.start_async({"x": x})
        for request in requests:
            await request.wait()

    async def threads() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(4):
                group.start_soon(anyio.to_thread.run_sync, session.run, None, {"x": x})

    ours, control = [], []
    for _ in range(5):  # alternate: the machine's load changes under both alike
        ours.append(np.percentile(await _ticker_delays(device), 99))
        control.append(np.percentile(await _ticker_delays(threads), 99))
    assert statistics.median(ours) < 2 * statistics.median(control) + 0.002, (ours, control)


# -- BATCH, PROCESS, serving ------------------------------------------------------------


@pytest.mark.anyio
async def test_batch_ort_batches_and_answers_query_model(core):
    model = mlp_model()
    compiled = core.compile_model(model, "BATCH:ORT", {"MAX_BATCH_SIZE": 8})
    xs = [rows(1 + i % 3, seed=i, width=4) for i in range(6)]
    outputs: list[ai.InferResults | None] = [None] * len(xs)

    async def one(index: int) -> None:
        outputs[index] = await compiled.infer({"x": xs[index]})

    async with anyio.create_task_group() as group:
        for index in range(len(xs)):
            group.start_soon(one, index)
    for x, results in zip(xs, outputs):
        assert results is not None
        for got, want in zip(results.to_tuple(), reference_outputs(model, {"x": x})):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert compiled.get_property("DEVICE_NAME") == "BATCH:ORT"
    assert sum(compiled.batch_statistics().values()) < len(xs)  # type: ignore[attr-defined]
    await compiled.close()
    # The target answers for the virtual device (CPU would leave Gelu out).
    assert core.query_model(gelu_model(), "BATCH:ORT") == {"matmul": "BATCH", "gelu": "BATCH"}
    assert core.query_model(gelu_model(), "PROCESS:ORT") == {
        "matmul": "PROCESS",
        "gelu": "PROCESS",
    }


@pytest.mark.anyio
async def test_process_ort_computes_and_cancels_in_the_worker(core):
    model = long_model()
    compiled = core.compile_model(model, "PROCESS:ORT", {"PERF_COUNT": True})
    try:
        assert compiled.get_property("DEVICE_NAME") == "PROCESS:ORT"
        assert compiled.get_property("ORT_PROVIDERS") == ("CPUExecutionProvider",)
        x = rows(256)  # long against the round trips to the worker
        full = await _full_run(compiled, x)
        request = compiled.create_infer_request()
        results = await request.infer({"x": rows(3)})
        np.testing.assert_allclose(
            results["y"], reference_outputs(model, {"x": rows(3)})[0], rtol=1e-4, atol=1e-5
        )
        nodes = _nodes(request)
        assert len(nodes) == 800 and {e["op_type"] for e in nodes} == {"MatMul", "Tanh"}
    finally:
        await compiled.close()
    # Cancellation is timed without PERF_COUNT: reading node timings makes the worker
    # start a new profiling session for the next run, which no cancel can shorten.
    compiled = core.compile_model(model, "PROCESS:ORT")
    try:
        request = compiled.create_infer_request()
        await request.infer({"x": x})  # warm: its first run connects to the worker
        full = await _full_run(compiled, x)
        start = time.perf_counter()
        with anyio.move_on_after(full / 10):
            await request.infer({"x": x})
        assert time.perf_counter() - start < full / 2, full
        assert isinstance(request.error, ai.InferCancelledError)
        assert (await request.infer({"x": rows(1)}))["y"].shape == (1, WIDTH)
    finally:
        await compiled.close()


def test_aioinfer_serve_serves_a_model_on_ort(tmp_path):
    repo = tmp_path / "repo"
    for name, config in (
        ("gelu", {"device": "ORT", "properties": {"ORT_PROVIDERS": ["CPUExecutionProvider"]}}),
        ("batched", {"device": "ORT", "batching": {"max_batch_size": 4, "timeout_ms": 5}}),
    ):
        (repo / name / "1").mkdir(parents=True)
        onnx.save(gelu_model(), repo / name / "1" / "model.onnx")
        (repo / name / "config.json").write_text(json.dumps(config))
    process, lines = start(str(repo), "--port", "0")
    try:
        port = wait_for(lines, r"running on http://127\.0\.0\.1:(\d+)").group(1)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        x = rows(3, width=4)
        for name in ("gelu", "batched"):
            tensor = httpclient.InferInput("x", [3, 4], "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer(name, [tensor])
            # com.microsoft's Gelu: only onnxruntime computes it.
            np.testing.assert_allclose(result.as_numpy("y"), gelu_reference(x), rtol=1e-4)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) in (0, -signal.SIGTERM)
    finally:
        process.kill()
        process.wait()


# -- short runs on the event loop -------------------------------------------------------


def _ran_on(request: ai.AsyncInferRequest) -> int:
    """The native id of the thread the request's last run used (PERF_COUNT records it)."""
    return request._request.node_profile.record.thread  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_short_runs_of_an_idle_stream_run_on_the_loop(core):
    loop_thread = threading.get_native_id()
    model = chain_model(3, 64)
    # A budget no run of this model exceeds, even on a loaded machine.
    config = {"PERF_COUNT": True, "ORT_INLINE_RUN_US": 10**6}
    compiled = core.compile_model(model, "ORT", config)
    request = compiled.create_infer_request()
    x = rows(1, width=64)
    await request.infer({"x": x})
    assert _ran_on(request) != loop_thread  # new input shapes: measured on a thread
    await request.infer({"x": x})
    assert _ran_on(request) == loop_thread  # known to be short, nothing else runs
    # Another run in flight on the stream: a short one waits for the thread too.
    long_request = compiled.create_infer_request()
    long_request.start_async({"x": rows(20000, width=64)})
    while not compiled.run_times.in_flight:  # until its run was handed to the thread
        await anyio.sleep(0)
    await request.infer({"x": x})
    assert _ran_on(request) != loop_thread
    await long_request.wait()
    never = core.compile_model(model, "ORT", {**config, "ORT_INLINE_RUN_US": 0})
    never_request = never.create_infer_request()
    for _ in range(3):
        await never_request.infer({"x": x})
        assert _ran_on(never_request) != loop_thread
    # Several streams: only runs shorter than a hop go inline (MULTI_STREAM_INLINE_S),
    # whatever the budget; a run of milliseconds keeps to the threads.
    streams = core.compile_model(model, "ORT", {**config, "NUM_STREAMS": 2})
    assert streams.run_times.budget <= MULTI_STREAM_INLINE_S
    tiny = streams.create_infer_request()
    await tiny.infer({"x": x})  # new shapes: measured on a thread
    if streams.run_times.seconds.get((x.shape,), 1.0) < MULTI_STREAM_INLINE_S:
        await tiny.infer({"x": x})  # a run shorter than the hop, nothing else runs
        assert _ran_on(tiny) == loop_thread
    big = {"x": rows(20000, width=64)}
    long_runs = streams.create_infer_request()
    for _ in range(3):
        await long_runs.infer(big)
        assert _ran_on(long_runs) != loop_thread


@pytest.mark.anyio
async def test_a_run_the_load_stretched_keeps_a_short_model_on_the_loop(core):
    """One run that the machine's load stretched far past ``ORT_INLINE_RUN_US`` (a time
    slice lost; recorded here as the request records a run, at 20 budgets) leaves the
    next run of a short model on the loop instead of sending it through the hop to a
    thread; runs that stay long send the next ones to a thread within a few runs."""
    compiled = core.compile_model(chain_model(3, 64), "ORT", {"ORT_INLINE_RUN_US": 10**5})
    times = compiled.run_times
    request = compiled.create_infer_request()
    x = rows(1, width=64)
    await request.infer({"x": x})  # new input shapes: measured on a thread
    await request.infer({"x": x})
    assert request.queued_seconds == 0.0  # inline: it waited for no thread
    shapes = (x.shape,)
    times.record(shapes, 20 * times.budget)
    await request.infer({"x": x})
    assert request.queued_seconds == 0.0
    for _ in range(3):
        times.record(shapes, 20 * times.budget)
    await request.infer({"x": x})
    assert request.queued_seconds > 0.0
    await compiled.close()


SYNC_CALLS = 21
"""Python calls per ``infer_sync`` on a short run (25 before the per-call work was cut)."""
AWAITED_CALLS = {"asyncio": 32, "trio": 36}
"""The same per awaited inline ``infer``, per backend (40 on both before)."""


@contextlib.contextmanager
def _counting_python_calls() -> Iterator[list[int]]:
    """Count the Python function calls (and coroutine resumptions) of this thread meanwhile,
    into the one-element list yielded."""
    calls = [0]

    def count(frame: object, event: str, arg: object) -> None:
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        yield calls
    finally:
        sys.setprofile(None)


@pytest.mark.anyio
async def test_the_request_paths_own_work_per_inference_stays_small(core):
    """aioinfer's own work per inference on a short run, counted as Python function calls
    (with ``sys.setprofile``: a count the machine's load does not change), once the run's
    time is known: ``infer_sync``, and an awaited ``infer`` that runs inline."""
    # A budget that no run reaches: every run inline, no loop turn within the test.
    compiled = core.compile_model(chain_model(3, 64), "ORT", {"ORT_INLINE_RUN_US": 10**6})
    request = compiled.create_infer_request()
    x = rows(1, width=64)
    for _ in range(3):
        await request.infer({"x": x})
    runs = 200
    with _counting_python_calls() as sync:
        for _ in range(runs):
            request.infer_sync({"x": x})
    with _counting_python_calls() as awaited:
        for _ in range(runs):
            await request.infer({"x": x})
    assert sync[0] / runs <= SYNC_CALLS
    assert awaited[0] / runs <= AWAITED_CALLS[sniffio.current_async_library()]
    await compiled.close()


@pytest.mark.anyio
async def test_runs_on_the_loop_still_let_other_tasks_run(core):
    """Inline runs give the loop a turn whenever it last had one ``ORT_INLINE_RUN_US``
    or more ago (see tests.helpers.assert_inline_runs_share_the_loop)."""
    compiled = core.compile_model(chain_model(3, 64), "ORT")
    budget = compiled.get_property("ORT_INLINE_RUN_US") / 1e6
    request = compiled.create_infer_request()
    x = rows(1, width=64)
    await request.infer({"x": x})  # its run time is known from now on

    # (A run that a loaded machine stretches past the budget goes to a thread, which
    # gives the loop turns too: the bound holds either way.)
    await assert_inline_runs_share_the_loop(lambda: request.infer({"x": x}), budget)


def _text_identity() -> onnx.ModelProto:
    text = onnx.TensorProto.STRING
    graph = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["y"])],
        "text",
        [oh.make_tensor_value_info("x", text, [None])],
        [oh.make_tensor_value_info("y", text, [None])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_string_tensors_are_utf8_bytes_in_and_out(core):
    request = core.compile_model(_text_identity(), "ORT").create_infer_request()
    words = np.array([b"alpha", "\u00e9t\u00e9".encode(), b""], dtype=object)
    assert list(request.infer_sync({"x": words})["y"]) == list(words)  # bytes, not "b'...'"
    with pytest.raises(ai.InputTypeError, match=r"input 'x': element 1 is not UTF-8"):
        request.infer_sync({"x": np.array([b"ok", b"\x00\xff"], dtype=object)})
    assert list(request.infer_sync({"x": words[:1]})["y"]) == [b"alpha"]  # still usable


def test_auto_runs_string_models_where_any_bytes_pass(core):
    compiled = core.compile_model(_text_identity(), "AUTO")
    assert compiled.get_property("EXECUTION_DEVICES") == ("CPU",)
    raw = np.array([b"\x00\xff raw"], dtype=object)
    assert list(compiled.create_infer_request().infer_sync({"x": raw})["y"]) == [b"\x00\xff raw"]
    with pytest.raises(ai.UnsupportedOperatorError, match="string tensors 'x', 'y'"):
        core.compile_model(_text_identity(), "OPENVINO")
