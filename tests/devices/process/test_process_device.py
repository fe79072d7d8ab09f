"""The PROCESS device: the model runs on its target device in a worker process.

Exactness: the worker runs the CPU device's own kernels with the same config, so results
equal the CPU device's bit for bit; against onnx.reference (float32 MatMul/Tanh chain)
they agree within ``rtol=1e-4, atol=1e-5``. Starting a worker costs about a second, so
the compiled models are shared by module-scoped fixtures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import onnx
import onnx.helper as oh
import onnx.reference
import pytest

import aioinfer as ai
from aioinfer.devices.batch import BatchCompiledModel
from aioinfer.devices.process import ProcessCompiledModel
from aioinfer.devices.process.handle import WorkerHandle
from tests.helpers import make_model, mlp_model, process_alive, reference_outputs, tensor_info

pytestmark = pytest.mark.anyio

WIDTH = 64
STEPS = 600
LONG_ROWS = 512
"""Rows that make the chain take a few hundred milliseconds."""
CONFIG = {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "INFERENCE_NUM_THREADS": 2}


def lab_model() -> onnx.ModelProto:
    """``y = tanh(... tanh(x @ w) ... @ w)`` (STEPS steps, long enough to cancel half-way)
    and ``g = Gather(table, idx)`` (an index out of range fails node ``gather``)."""
    rng = np.random.default_rng(0)
    weights = {
        "w": (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32),
        "table": rng.standard_normal((4, 2)).astype(np.float32),
    }
    nodes, last = [], "x"
    for i in range(STEPS):
        nodes.append(oh.make_node("MatMul", [last, "w"], [f"m{i}"], name=f"matmul{i}"))
        nodes.append(oh.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
        last = f"t{i}"
    nodes.append(oh.make_node("Identity", [last], ["y"], name="out"))
    nodes.append(oh.make_node("Gather", ["table", "idx"], ["g"], name="gather"))
    return make_model(
        nodes,
        [tensor_info("x", np.float32, ["n", WIDTH]), tensor_info("idx", np.int64, ["k"])],
        [tensor_info("y", np.float32, ["n", WIDTH]), tensor_info("g", np.float32, ["k", 2])],
        weights,
        name="lab",
    )


def feeds(rows: int, idx: list[int] | None = None, seed: int = 1) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((rows, WIDTH)).astype(np.float32)
    return {"x": x, "idx": np.array(idx if idx is not None else [3, 0, 1], np.int64)}


def close(compiled: ai.CompiledModel) -> None:
    anyio.run(compiled.close)


@pytest.fixture(scope="module")
def lab(core: ai.Core) -> Iterator[ProcessCompiledModel]:
    """The lab model on PROCESS:CPU, two streams, node timings on."""
    compiled = core.compile_model(lab_model(), "PROCESS:CPU", {**CONFIG, "PERF_COUNT": True})
    assert isinstance(compiled, ProcessCompiledModel)
    yield compiled
    close(compiled)


@pytest.fixture(scope="module")
def lab_cpu(core: ai.Core) -> Iterator[ai.CompiledModel]:
    compiled = core.compile_model(lab_model(), "CPU", {**CONFIG, "PERF_COUNT": True})
    yield compiled
    close(compiled)


@pytest.fixture(scope="module")
def batched(core: ai.Core, anyio_backend: str) -> Iterator[BatchCompiledModel]:
    """``mlp`` on BATCH:PROCESS:CPU, one per backend (the batcher keeps loop objects)."""
    config = {"MAX_BATCH_SIZE": 8, "BATCH_TIMEOUT_MS": 20, "NUM_STREAMS": 1}
    compiled = core.compile_model(mlp_model(), "BATCH:PROCESS:CPU", config)
    assert isinstance(compiled, BatchCompiledModel)
    yield compiled
    close(compiled)


# -- results ------------------------------------------------------------------------------


async def test_results_equal_cpu_and_reference(
    lab: ProcessCompiledModel, lab_cpu: ai.CompiledModel
) -> None:
    inputs = feeds(3)
    results = await lab.create_infer_request().infer(inputs)
    expected = (await lab_cpu.create_infer_request().infer(inputs)).to_tuple()
    for got, want in zip(results.to_tuple(), expected):
        np.testing.assert_array_equal(got, want)
    reference = onnx.reference.ReferenceEvaluator(lab_model()).run(None, inputs)
    for got, want in zip(results.to_tuple(), reference):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # The caller owns the outputs.
    assert all(a.flags.writeable and a.flags.owndata for a in results.to_tuple())
    # The pooled path and the synchronous path give the same.
    pooled = await lab.infer(inputs)
    np.testing.assert_array_equal(pooled["y"], results["y"])
    np.testing.assert_array_equal(lab.create_infer_request().infer_sync(inputs)["g"], expected[1])


async def test_concurrent_requests_get_their_own_results(lab: ProcessCompiledModel) -> None:
    inputs = [feeds(2, [i % 4], seed=i) for i in range(6)]
    results: list[Any] = [None] * len(inputs)
    before = set(threading.enumerate())  # earlier tests' models may keep callback threads

    async def one(index: int) -> None:
        results[index] = await lab.infer(inputs[index])

    async with anyio.create_task_group() as group:
        for index in range(len(inputs)):
            group.start_soon(one, index)
    # Six requests on two worker streams: the rest waited in the worker, and no thread of
    # this process waited for the worker (the event loop watched the connections).
    started = set(threading.enumerate()) - before
    assert not [t for t in started if t.name.startswith("aioinfer-PROCESS")]
    reference = onnx.reference.ReferenceEvaluator(lab_model())
    for feed, got in zip(inputs, results):
        np.testing.assert_allclose(got["y"], reference.run(None, feed)[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got["g"], reference.run(None, feed)[1])


async def test_profiling_has_stages_and_worker_node_timings(
    lab: ProcessCompiledModel, lab_cpu: ai.CompiledModel
) -> None:
    request = lab.create_infer_request()
    await request.infer(feeds(2))
    info = request.get_profiling_info()
    stages = [e["name"] for e in info if e["type"] == "stage"]
    nodes = [e for e in info if e["type"] == "node"]
    assert stages == ["preprocess", "start", "wait", "postprocess"]
    on_cpu = lab_cpu.create_infer_request()
    await on_cpu.infer(feeds(2))
    cpu_info = on_cpu.get_profiling_info()
    expected = [(e["name"], e["op_type"]) for e in cpu_info if e["type"] == "node"]
    assert [(e["name"], e["op_type"]) for e in nodes] == expected
    assert "gather" in {e["name"] for e in nodes}
    assert all(e["seconds"] >= 0 for e in info)


# -- BATCH:PROCESS:CPU --------------------------------------------------------------------


async def test_batch_on_process_batches_and_matches(batched: BatchCompiledModel) -> None:
    rows = np.random.default_rng(2).standard_normal((16, 4)).astype(np.float32)
    results: list[Any] = [None] * len(rows)

    async def one(index: int) -> None:
        results[index] = await batched.infer({"x": rows[index : index + 1]})

    async with anyio.create_task_group() as group:
        for index in range(len(rows)):
            group.start_soon(one, index)
    y, z = reference_outputs(mlp_model(), {"x": rows})
    for index, got in enumerate(results):
        np.testing.assert_allclose(got["y"], y[index : index + 1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["z"], z[index : index + 1], rtol=1e-5, atol=1e-6)
    statistics = batched.batch_statistics()
    assert sum(rows * count for rows, count in statistics.items()) >= 16
    assert max(statistics) > 1  # concurrent rows were joined
    assert batched.get_property("DEVICE_NAME") == "BATCH:PROCESS:CPU"
    assert batched.get_property("NUM_STREAMS") == 1
    assert isinstance(batched.target, ProcessCompiledModel)


async def test_queued_seconds_is_the_wait_in_the_worker(core: ai.Core) -> None:
    compiled = core.compile_model(lab_model(), "PROCESS:CPU", {"NUM_STREAMS": 1})
    try:
        assert compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 2
        first, second = compiled.create_infer_request(), compiled.create_infer_request()
        slow = feeds(LONG_ROWS)
        await first.infer(slow)  # the first run of a shape records the memory plan
        start = time.perf_counter()
        await first.infer(slow)
        alone = time.perf_counter() - start
        assert first.queued_seconds < alone / 2
        took: list[float] = []

        async def timed(request: ai.InferRequest) -> None:
            start = time.perf_counter()
            await request.infer(slow)
            took.append(time.perf_counter() - start)

        async with anyio.create_task_group() as group:
            group.start_soon(timed, first)
            await anyio.wait_all_tasks_blocked()  # sent: it awaits the worker's reply
            group.start_soon(timed, second)
        # One stream in the worker: one of the two waited there for the other's compute
        # (the worker takes them in the order its connection threads receive them), most
        # of the call that ended first; that one waited for nothing.
        waits = sorted([first.queued_seconds, second.queued_seconds])
        sooner = min(took)
        assert waits[0] < sooner / 2 and waits[1] > sooner / 2, (took, waits)
    finally:
        await compiled.close()


def test_large_replies_on_uvloop_arrive_whole(core: ai.Core) -> None:
    """uvloop makes a socket it watched non-blocking: a reply of several hundred KB that
    has only partly arrived must still be read whole, not fail as a dead worker."""
    uvloop = pytest.importorskip("uvloop")  # in the test extra (POSIX)
    width = 1 << 16  # 256 KB per row, each way
    model = make_model(
        [oh.make_node("Tanh", ["x"], ["y"])],
        [tensor_info("x", np.float32, ["n", width])],
        [tensor_info("y", np.float32, ["n", width])],
    )
    compiled = core.compile_model(model, "BATCH:PROCESS:CPU", {"MAX_BATCH_SIZE": 8})
    rows = np.random.default_rng(4).standard_normal((32, width)).astype(np.float32)
    results: list[Any] = [None] * len(rows)

    async def main() -> None:
        async def one(index: int) -> None:
            for _ in range(3):
                results[index] = await compiled.infer({"x": rows[index : index + 1]})

        async with anyio.create_task_group() as group:
            for index in range(len(rows)):
                group.start_soon(one, index)
        await compiled.close()

    uvloop.run(main())
    (expected,) = reference_outputs(model, {"x": rows})
    np.testing.assert_allclose(np.concatenate([r["y"] for r in results]), expected, rtol=1e-4)


def test_batch_refuses_itself_as_nested_target(core: ai.Core) -> None:
    with pytest.raises(ai.UnknownDeviceError, match="not itself; got 'BATCH:CPU'"):
        core.compile_model(mlp_model(), "BATCH:BATCH:CPU")


# -- properties ---------------------------------------------------------------------------


async def test_properties_are_the_targets(
    lab: ProcessCompiledModel, lab_cpu: ai.CompiledModel
) -> None:
    assert lab.get_property("DEVICE_NAME") == "PROCESS:CPU"
    assert lab.get_property("TARGET_DEVICE") == "CPU"
    assert lab.get_property("NUM_STREAMS") == 2
    assert lab.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS") == 4  # THROUGHPUT: 2 a stream
    assert lab.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert lab.get_property("INFERENCE_NUM_THREADS") == 2
    assert lab.get_property("WORKER_TIMEOUT_S") == 30.0  # the default
    supported = lab.get_property("SUPPORTED_PROPERTIES")
    assert supported[:2] == ("TARGET_DEVICE", "WORKER_TIMEOUT_S")
    assert set(supported[2:]) == set(lab_cpu.get_property("SUPPORTED_PROPERTIES"))
    for name in ("NETWORK_NAME", "PERF_COUNT", "STATEFUL", "ALLOW_AUTO_BATCHING", "NUM_CORES"):
        assert lab.get_property(name) == lab_cpu.get_property(name), name
    assert lab.streams == 2
    await lab.infer(feeds(4))
    assert lab.get_property("ACTIVATION_MEMORY_BYTES") > 0  # read from the worker, now
    with pytest.raises(ai.UnknownPropertyError, match="'MAX_BATCH_SIZE'"):
        lab.get_property("MAX_BATCH_SIZE")
    assert repr(lab) == "<CompiledModel 'lab' on PROCESS:CPU>"


def test_plugin_properties_and_discovery(core: ai.Core) -> None:
    assert "PROCESS" in core.available_devices
    assert core.get_property("PROCESS", "DEVICE_NAME") == "PROCESS"
    assert "TARGET_DEVICE" in core.get_property("PROCESS", "SUPPORTED_PROPERTIES")
    assert set(core.query_model(mlp_model(), "PROCESS").values()) == {"PROCESS"}


# -- errors -------------------------------------------------------------------------------


async def test_bad_input_is_refused_before_sending(
    lab: ProcessCompiledModel, lab_cpu: ai.CompiledModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    link = lab.supervisor.link_async

    async def spy(*args: Any) -> Any:
        calls.append(args)
        return await link(*args)

    monkeypatch.setattr(lab.supervisor, "link_async", spy)
    request = lab.create_infer_request()
    bad = [
        {"x": np.zeros((2, WIDTH), np.float64), "idx": np.zeros(1, np.int64)},
        {"x": np.zeros((2, 3), np.float32), "idx": np.zeros(1, np.int64)},
        {"x": np.zeros((2, WIDTH), np.float32)},
        {"nope": np.zeros(1)},
    ]
    for inputs in bad:
        with pytest.raises(ai.InputError) as got:
            await request.infer(inputs)
        with pytest.raises(ai.InputError) as want:
            await lab_cpu.create_infer_request().infer(inputs)
        assert type(got.value) is type(want.value)
        assert str(got.value) == str(want.value)
        request = lab.create_infer_request()  # a fresh one: no inputs left over
    assert calls == []
    assert (await request.infer(feeds(1)))["y"].shape == (1, WIDTH)  # still usable


async def test_kernel_failure_names_the_node_like_cpu(
    lab: ProcessCompiledModel, lab_cpu: ai.CompiledModel
) -> None:
    request = lab.create_infer_request()
    with pytest.raises(ai.InferenceError) as got:
        await request.infer(feeds(1, [7]))
    with pytest.raises(ai.InferenceError) as want:
        await lab_cpu.create_infer_request().infer(feeds(1, [7]))
    assert "'gather'" in str(got.value)
    assert str(got.value) == str(want.value)
    results = await request.infer(feeds(1, [2]))  # the request is reusable
    np.testing.assert_array_equal(results["g"], lab_model_table()[[2]])


def lab_model_table() -> np.ndarray:
    table = next(t for t in lab_model().graph.initializer if t.name == "table")
    return onnx.numpy_helper.to_array(table)


def test_compile_errors_keep_their_class(core: ai.Core) -> None:
    bad_op = make_model(
        [oh.make_node("Frobnicate", ["x"], ["y"], domain="custom.domain", name="frob")],
        [tensor_info("x", np.float32, [2])],
        [tensor_info("y", np.float32, [2])],
        opsets={"": 18, "custom.domain": 1},
    )
    with pytest.raises(ai.UnsupportedOperatorError) as got:
        core.compile_model(bad_op, "PROCESS:CPU")
    with pytest.raises(ai.UnsupportedOperatorError) as want:
        core.compile_model(bad_op, "CPU")
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize(
    ("device", "config", "error", "words"),
    [
        ("PROCESS:NOPE", {}, ai.UnknownDeviceError, ["'NOPE'", "available"]),
        ("PROCESS:BATCH", {}, ai.UnknownDeviceError, ["plain target", "BATCH:PROCESS:CPU"]),
        ("PROCESS:PROCESS", {}, ai.UnknownDeviceError, ["plain target", "'PROCESS'"]),
        ("PROCESS:CPU", {"MAX_BATCH_SIZE": 2}, ai.UnknownPropertyError, ["'MAX_BATCH_SIZE'"]),
        ("PROCESS:CPU", {"NUM_STREAMS": 0}, ai.InvalidPropertyValueError, ["'NUM_STREAMS'"]),
        ("PROCESS:CPU", {"STATEFUL": "auto"}, ai.InvalidPropertyValueError, ["convention"]),
        ("PROCESS:CPU", {"WORKER_TIMEOUT_S": 0}, ai.InvalidPropertyValueError, ["> 0"]),
        ("PROCESS:CPU", {"WORKER_TIMEOUT_S": "soon"}, ai.InvalidPropertyValueError, ["number"]),
        ("BATCH:PROCESS:CPU", {"WORKER_TIMEOUT_S": -1}, ai.InvalidPropertyValueError, ["> 0"]),
    ],
)
def test_bad_target_or_config_fails_before_a_worker_starts(
    core: ai.Core,
    device: str,
    config: dict[str, Any],
    error: type[Exception],
    words: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts: list[str] = []
    start = WorkerHandle.start

    def counted_start(device_name: str, *args: Any, **kwargs: Any) -> Any:
        starts.append(device_name)
        return start(device_name, *args, **kwargs)

    monkeypatch.setattr(WorkerHandle, "start", counted_start)
    with pytest.raises(error) as raised:
        core.compile_model(mlp_model(), device, config)
    assert all(word in str(raised.value) for word in words), str(raised.value)
    assert starts == []  # no worker process was started


async def test_export_and_import_are_refused(lab: ProcessCompiledModel, core: ai.Core) -> None:
    with pytest.raises(ai.ExportError, match="'PROCESS'"):
        lab.export_model()
    with pytest.raises(ai.ImportModelError, match="'PROCESS'"):
        core.import_model(b"blob", "PROCESS")


# -- cancellation -------------------------------------------------------------------------


async def test_cancel_stops_the_worker_compute(lab: ProcessCompiledModel) -> None:
    inputs = feeds(LONG_ROWS)
    request = lab.create_infer_request()
    started = time.perf_counter()
    await request.infer(inputs)
    full = time.perf_counter() - started

    # request.cancel(): the awaiter gets InferCancelledError once the worker stopped.
    async def cancel_soon() -> None:
        await anyio.sleep(full / 10)
        request.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(cancel_soon)
        started = time.perf_counter()
        with pytest.raises(ai.InferCancelledError):
            await request.infer(inputs)
    stopped = time.perf_counter() - started
    assert stopped < full / 2, (stopped, full)

    # Cancelling the awaiting task stops it too; the request is reusable after both.
    started = time.perf_counter()
    with anyio.move_on_after(full / 10):
        await request.infer(inputs)
    assert time.perf_counter() - started < full / 2
    results = await request.infer(feeds(2))
    assert results["y"].shape == (2, WIDTH)


# -- the worker's life --------------------------------------------------------------------


def test_close_stops_the_worker(core: ai.Core) -> None:
    compiled = core.compile_model(mlp_model(), "PROCESS:CPU")
    assert isinstance(compiled, ProcessCompiledModel)
    compiled.create_infer_request().infer_sync({"x": np.ones((1, 4), np.float32)})
    worker = compiled.supervisor.worker
    assert worker is not None
    close(compiled)
    assert worker.process.returncode == 0  # it exited when asked
    assert not process_alive(worker.pid)
    assert not compiled.ready()
    with pytest.raises(ai.RequestClosedError):
        compiled.create_infer_request()
    close(compiled)  # a second close is harmless


def test_worker_exits_when_the_parent_dies(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    # No `if __name__ == "__main__"` guard: the worker never imports the parent's main.
    script.write_text(
        "import os, signal, onnx, aioinfer as ai\n"
        "compiled = ai.Core().compile_model(onnx.load(os.environ['MODEL']), 'PROCESS:CPU')\n"
        "print(compiled.worker_pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    onnx.save(mlp_model(), tmp_path / "model.onnx")
    env = {**os.environ, "MODEL": str(tmp_path / "model.onnx")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 60  # a hang guard: the loop ends when the worker does
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(pid)
