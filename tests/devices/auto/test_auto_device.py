"""The AUTO device: the default device, its priority list, fallback, and what it passes on."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import aioinfer
from aioinfer.errors import UnknownPropertyError, UnsupportedOperatorError
from tests.helpers import (
    accumulator_model,
    make_model,
    mlp_model,
    reference_outputs,
    tensor_info,
)

ROOT = Path(__file__).resolve().parents[3]


def gelu_model() -> onnx.ModelProto:
    """``com.microsoft`` Gelu: onnxruntime and OpenVINO run it, the numpy CPU does not."""
    return make_model(
        [oh.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", name="gelu")],
        [tensor_info("x", np.float32, ["n", 4])],
        [tensor_info("y", np.float32, ["n", 4])],
        opsets={"": 18, "com.microsoft": 1},
    )


def nobody_model() -> onnx.ModelProto:
    """An operator of a domain no device knows."""
    return oh.make_model(
        oh.make_graph(
            [oh.make_node("Frobnicate", ["x"], ["y"], domain="example.nobody", name="frob")],
            "nobody",
            [tensor_info("x", np.float32, [2])],
            [tensor_info("y", np.float32, [2])],
        ),
        opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("example.nobody", 1)],
    )


def test_default_device_is_auto_and_picks_ort(core: aioinfer.Core) -> None:
    """No device named: AUTO compiles on the first installed device of its list (ORT
    here: onnxruntime is installed with the test extra) and says so."""
    model = mlp_model()
    compiled = core.compile_model(model)
    assert compiled.get_property("DEVICE_NAME") == "AUTO"
    assert compiled.get_property("EXECUTION_DEVICES") == ("ORT",)
    assert compiled.get_property("DEVICE_PRIORITIES") == ("ORT", "OPENVINO", "CPU")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    results = compiled.create_infer_request().infer_sync({"x": x})
    for got, expected in zip(results.to_tuple(), reference_outputs(model, {"x": x})):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert aioinfer.compile_model(model).get_property("EXECUTION_DEVICES") == ("ORT",)


@pytest.mark.parametrize(
    ("device", "config"),
    [
        ("AUTO:CPU", {}),
        ("AUTO", {"DEVICE_PRIORITIES": "CPU,ORT"}),
        ("AUTO", {"DEVICE_PRIORITIES": ["NOSUCHDEVICE", "CPU"]}),
    ],
)
def test_priorities_choose_the_device(
    core: aioinfer.Core, device: str, config: dict[str, object]
) -> None:
    compiled = core.compile_model(mlp_model(), device, config)
    assert compiled.get_property("EXECUTION_DEVICES") == ("CPU",)


def test_priorities_set_on_the_core() -> None:
    core = aioinfer.Core()
    core.set_property("AUTO", {"DEVICE_PRIORITIES": "CPU"})
    assert core.compile_model(mlp_model()).get_property("EXECUTION_DEVICES") == ("CPU",)


def test_unsupported_operator_falls_back_to_the_next_device(core: aioinfer.Core) -> None:
    """CPU first, but it has no com.microsoft Gelu (its query_model says so): ORT runs it."""
    model = gelu_model()
    compiled = core.compile_model(model, "AUTO:CPU,ORT")
    assert compiled.get_property("EXECUTION_DEVICES") == ("ORT",)
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    y = compiled.create_infer_request().infer_sync({"x": x})[0]
    erf = np.vectorize(__import__("math").erf)
    np.testing.assert_allclose(y, 0.5 * x * (1 + erf(x / np.sqrt(2))), rtol=1e-5, atol=1e-6)


def test_a_property_only_one_device_takes_chooses_it(core: aioinfer.Core) -> None:
    """INFERENCE_PRECISION_HINT is OPENVINO's: ORT refuses the config, OPENVINO is next."""
    compiled = core.compile_model(mlp_model(), "AUTO", {"INFERENCE_PRECISION_HINT": "f32"})
    assert compiled.get_property("EXECUTION_DEVICES") == ("OPENVINO",)


def test_no_device_can_run_the_model(core: aioinfer.Core) -> None:
    with pytest.raises(UnsupportedOperatorError) as caught:
        core.compile_model(nobody_model(), "AUTO:ORT,CPU")
    message = str(caught.value)
    assert "ORT: " in message and "CPU: " in message and "Frobnicate" in message


def test_a_property_no_device_declares(core: aioinfer.Core) -> None:
    with pytest.raises(UnknownPropertyError, match="'NO_SUCH_PROPERTY'"):
        core.compile_model(mlp_model(), "AUTO", {"NO_SUCH_PROPERTY": 1})


def test_auto_cannot_list_itself(core: aioinfer.Core) -> None:
    with pytest.raises(aioinfer.InvalidPropertyValueError, match="AUTO cannot be one"):
        core.compile_model(mlp_model(), "AUTO", {"DEVICE_PRIORITIES": "AUTO,CPU"})


def test_properties_reach_the_chosen_device(core: aioinfer.Core) -> None:
    compiled = core.compile_model(
        mlp_model(),
        "AUTO",
        {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2, "ALLOW_AUTO_BATCHING": False},
    )
    assert compiled.get_property("EXECUTION_DEVICES") == ("ORT",)
    assert compiled.get_property("PERFORMANCE_HINT") == "THROUGHPUT"
    assert compiled.get_property("NUM_STREAMS") == 2
    assert compiled.max_batch_size() is None  # not batched: ALLOW_AUTO_BATCHING is NO


def test_throughput_batches_a_batchable_model_on_the_chosen_device(core: aioinfer.Core) -> None:
    compiled = core.compile_model(mlp_model(), config={"PERFORMANCE_HINT": "THROUGHPUT"})
    assert compiled.get_property("DEVICE_NAME") == "BATCH:AUTO"
    assert compiled.get_property("EXECUTION_DEVICES") == ("ORT",)
    assert compiled.max_batch_size() is not None


def test_stateful_through_auto(core: aioinfer.Core) -> None:
    """STATEFUL goes to the chosen device: each step adds x to the request's state."""
    compiled = core.compile_model(accumulator_model(), "AUTO", {"STATEFUL": {"past": "present"}})
    assert compiled.get_property("EXECUTION_DEVICES") == ("ORT",)
    request = compiled.create_infer_request()
    x = np.arange(4, dtype=np.int64).reshape(1, 4)
    request.infer_sync({"x": x})
    np.testing.assert_array_equal(request.infer_sync({"x": x})["y"], 2 * x)


def test_cache_dir_through_auto(tmp_path: Path) -> None:
    """CACHE_DIR reaches a chosen device that caches (the second compile loads)."""
    core = aioinfer.Core()
    config = {"CACHE_DIR": str(tmp_path)}
    first = core.compile_model(mlp_model(), "AUTO:CPU", config)
    second = core.compile_model(mlp_model(), "AUTO:CPU", config)
    assert (first.get_property("LOADED_FROM_CACHE"), second.get_property("LOADED_FROM_CACHE")) == (
        False,
        True,
    )


def test_auto_is_not_a_device_that_runs_models(core: aioinfer.Core) -> None:
    assert "AUTO" in core.available_devices
    assert "AUTO" not in core.get_available_devices()


@pytest.mark.anyio
async def test_batch_and_process_over_auto(core: aioinfer.Core) -> None:
    model = mlp_model()
    x = np.ones((1, 4), np.float32)
    expected = reference_outputs(model, {"x": x})[0]
    batched = core.compile_model(model, "BATCH:AUTO")
    assert batched.get_property("EXECUTION_DEVICES") == ("ORT",)
    np.testing.assert_allclose((await batched.infer({"x": x}))[0], expected, rtol=1e-5)
    await batched.close()
    async with core.compile_model(model, "PROCESS:AUTO", {"DEVICE_PRIORITIES": "CPU"}) as worker:
        assert worker.get_property("EXECUTION_DEVICES") == ("CPU",)
        np.testing.assert_allclose((await worker.infer({"x": x}))[0], expected, rtol=1e-5)


BLOCKED = """
import sys
sys.modules["onnxruntime"] = None  # import onnxruntime now raises ImportError
sys.modules["openvino"] = None
"""


def run_without_engines(code: str) -> str:
    """Run ``code`` in a fresh interpreter where onnxruntime and openvino cannot be
    imported (as when they are not installed); return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_engines_auto_falls_back_to_cpu(tmp_path: Path) -> None:
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    out = run_without_engines(
        f"""
        import numpy as np
        import aioinfer
        compiled = aioinfer.compile_model({str(tmp_path / "mlp.onnx")!r})
        print(compiled.get_property("EXECUTION_DEVICES"))
        print(compiled.create_infer_request().infer_sync({{"x": np.ones((1, 4), np.float32)}})[1])
        print(sorted(m for m in sys.modules if m.startswith(("onnxruntime", "openvino"))))
        """
    )
    devices, _, imported = out.strip().splitlines()
    assert devices == "('CPU',)"
    assert imported == "['onnxruntime', 'openvino']"  # only the blocking entries


def test_info_says_which_devices_are_available() -> None:
    out = run_without_engines(
        """
        from aioinfer.cli import main
        main(["info"])
        """
    )
    lines = [line for line in out.splitlines() if not line.startswith(" ")]
    assert "CPU" in lines and "AUTO" in lines
    ort = next(line for line in lines if line.startswith("ORT "))
    assert ort.startswith("ORT (not available: ") and "onnxruntime" in ort
    openvino = next(line for line in lines if line.startswith("OPENVINO "))
    assert openvino.startswith("OPENVINO (not available: ") and "openvino" in openvino
    available = lines[-1].removeprefix("available here: ").split(", ")
    assert "CPU" in available and "ORT" not in available and "OPENVINO" not in available


def test_run_logs_the_chosen_device(capsys: pytest.CaptureFixture[str]) -> None:
    from aioinfer.cli import main

    assert main(["run"]) == 0
    assert "device:       AUTO (on ORT)" in capsys.readouterr().out
    assert main(["run", "--device", "AUTO:CPU"]) == 0
    assert "device:       AUTO:CPU (on CPU, compiled as AUTO)" in capsys.readouterr().out


# -- real exports and AUTO's reasons ----------------------------------------------------

EXPORTS = ROOT / "tests" / "data" / "torch_exports"
"""PyTorch exports (``scripts/make_torch_exports.py``): an MLP, an LSTM and a transformer
encoder block, each with the ``Constant`` nodes PyTorch's exporter writes."""

ENGINES = {"ORT": "onnxruntime", "OPENVINO": "openvino"}


def run_with_engines(installed: set[str], code: str) -> str:
    """Run ``code`` in a fresh interpreter where only the engines of ``installed`` (of
    :data:`ENGINES`) can be imported, as when the others are not installed; its stdout."""
    blocked = "".join(
        f"sys.modules[{package!r}] = None\n"
        for device, package in ENGINES.items()
        if device not in installed
    )
    done = subprocess.run(
        [sys.executable, "-c", "import sys\n" + blocked + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_exports_have_constant_nodes() -> None:
    for name in ("mlp", "lstm", "encoder"):
        nodes = onnx.load(EXPORTS / f"{name}.onnx").graph.node
        assert any(node.op_type == "Constant" for node in nodes), name


@pytest.mark.parametrize(
    ("installed", "chosen"),
    [
        ({"ORT", "OPENVINO"}, "ORT"),
        ({"ORT"}, "ORT"),
        ({"OPENVINO"}, "OPENVINO"),
        (set(), "CPU"),
    ],
    ids=["both", "ort-only", "openvino-only", "neither"],
)
def test_auto_runs_pytorch_exports_on_the_first_installed_engine(
    installed: set[str], chosen: str
) -> None:
    """Each export compiles (AUTO, the default list ORT, OPENVINO, CPU) on the first
    engine installed, whose query runs every node; an engine missing is passed over as
    not available, and the outputs are the CPU device's."""
    out = run_with_engines(
        installed,
        f"""
        import json
        import numpy as np
        import aioinfer
        core = aioinfer.Core()
        for name, shape in [("mlp", (3, 16)), ("lstm", (3, 5, 8)), ("encoder", (3, 6, 32))]:
            path = {str(EXPORTS)!r} + f"/{{name}}.onnx"
            compiled = core.compile_model(path)
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            y = compiled.create_infer_request().infer_sync({{"x": x}})["y"]
            expected = core.compile_model(path, "CPU").create_infer_request().infer_sync(
                {{"x": x}})["y"]
            print(json.dumps([
                name,
                compiled.get_property("EXECUTION_DEVICES"),
                compiled.get_property("PASSED_OVER_DEVICES"),
                float(np.max(np.abs(y - expected))),
            ]))
        """,
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line[0] for line in lines] == ["mlp", "lstm", "encoder"]
    priorities = ("ORT", "OPENVINO", "CPU")
    skipped = list(priorities[: priorities.index(chosen)])
    for name, devices, passed_over, difference in lines:
        assert devices == [chosen], name
        assert [device for device, _ in passed_over] == skipped, name
        for device, reason in passed_over:
            assert reason.startswith("not available: ") and ENGINES[device] in reason, reason
        assert difference < 1e-4, name


def test_every_device_runs_every_node_of_the_exports(core: aioinfer.Core) -> None:
    for name in ("mlp", "lstm", "encoder"):
        model = core.read_model(EXPORTS / f"{name}.onnx")
        nodes = {node.name for node in model.ir.graph}
        for device in ("ORT", "OPENVINO", "CPU"):
            assert set(core.query_model(model, device)) == nodes, (name, device)


def strings_model() -> onnx.ModelProto:
    """An Identity over strings: onnxruntime's strings are text, so ORT leaves it out."""
    return make_model(
        [oh.make_node("Identity", ["x"], ["y"], name="copy")],
        [tensor_info("x", np.str_, [2])],
        [tensor_info("y", np.str_, [2])],
    )


def test_passed_over_devices_say_why(core: aioinfer.Core, caplog: pytest.LogCaptureFixture) -> None:
    """A device missing, a device whose compile refuses the config, a device whose query
    leaves nodes out: each is named with its reason, in the property and in the log."""
    with caplog.at_level(logging.INFO, logger="aioinfer.devices.auto"):
        compiled = core.compile_model(
            mlp_model(), "AUTO:NOSUCHDEVICE,ORT,OPENVINO", {"INFERENCE_PRECISION_HINT": "f32"}
        )
    assert compiled.get_property("EXECUTION_DEVICES") == ("OPENVINO",)
    (missing, missing_reason), (ort, ort_reason) = compiled.get_property("PASSED_OVER_DEVICES")
    assert missing == "NOSUCHDEVICE" and missing_reason.startswith("not available: ")
    assert "'NOSUCHDEVICE'" in missing_reason
    assert ort == "ORT"
    assert ort_reason.startswith("compile failed: UnknownPropertyError: ")
    assert "INFERENCE_PRECISION_HINT" in ort_reason
    (record,) = caplog.records
    assert record.levelno == logging.WARNING  # ORT is installed, yet could not run it
    assert record.getMessage() == (
        f"AUTO compiled model 'mlp' on OPENVINO; passed over NOSUCHDEVICE: {missing_reason}"
        f"; passed over ORT: {ort_reason}"
    )

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aioinfer.devices.auto"):
        compiled = core.compile_model(strings_model(), "AUTO:ORT,CPU")
    assert compiled.get_property("PASSED_OVER_DEVICES") == (
        ("ORT", "cannot run 1 of 1 nodes (operators Identity): 'copy'"),
    )
    assert compiled.get_property("EXECUTION_DEVICES") == ("CPU",)
    assert "PASSED_OVER_DEVICES" in compiled.get_property("SUPPORTED_PROPERTIES")

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aioinfer.devices.auto"):
        first = core.compile_model(mlp_model(), "AUTO:ORT,CPU")
    assert first.get_property("PASSED_OVER_DEVICES") == ()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "AUTO compiled model 'mlp' on ORT")
    ]


def test_unsupported_nodes_are_named_a_few_at_a_time() -> None:
    from aioinfer.devices.auto.plugin import unsupported_nodes

    nodes = [(f"n{i}", "If" if i % 2 else "Constant") for i in range(5)]
    assert unsupported_nodes(nodes, 40) == (
        "cannot run 5 of 40 nodes (operators Constant, If): 'n0', 'n1', 'n2' and 2 more"
    )


def test_info_explains_autos_choice_for_a_model() -> None:
    """Without onnxruntime, ``aioinfer info MODEL`` says ORT was passed over (not
    installed) and OPENVINO chosen; with AUTO's own list, a device whose query leaves
    nodes out is named with them."""
    out = run_with_engines(
        {"OPENVINO"},
        f"""
        from aioinfer.cli import main
        assert main(["info", {str(EXPORTS / "lstm.onnx")!r}]) == 0
        """,
    )
    lines = out.splitlines()
    assert lines[0].startswith("model 'main_graph' (") and lines[0].endswith("lstm.onnx)")
    assert lines[1].startswith("ORT: passed over: not available: ") and "onnxruntime" in lines[1]
    assert lines[2:] == ["OPENVINO: chosen"]


def test_info_model_explains_only_auto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from aioinfer.cli import main

    onnx.save(strings_model(), tmp_path / "strings.onnx")
    assert main(["info", str(tmp_path / "strings.onnx"), "--device", "AUTO:ORT,CPU"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "ORT: passed over: cannot run 1 of 1 nodes (operators Identity): 'copy'",
        "CPU: chosen",
    ]
    assert main(["info", str(tmp_path / "strings.onnx"), "--device", "CPU"]) == 2
    assert "--device AUTO[:LIST], not 'CPU'" in capsys.readouterr().err
