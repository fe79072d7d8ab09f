"""The ``aioinfer`` command: run a model once (or N times) and describe the devices.

aioinfer run [MODEL_OR_BLOB] [--device AUTO] [--input NAME=FILE.npy] [--shape NAME=1,3,32,32]
             [--hint LATENCY|THROUGHPUT] [--iterations N] [--seed S]
aioinfer bench [MODEL] [--hint H] [--requests N] [--duration S | --iterations N] ...
aioinfer serve REPOSITORY_OR_MODEL [--model-name NAME] [--host 127.0.0.1] [--port 8000]
               [--access-log]
               [--switch-interval S] [limits: --max-sequences N --header-timeout S ...]
               [--ssl-certfile PEM --ssl-keyfile PEM] [--api-key KEY | $AIOINFER_API_KEY]
               [--grpc-port PORT]
               [--ray [--replicas N]]
aioinfer compile MODEL -d DEVICE [-o BLOB] [-c KEY=VALUE ...]
aioinfer info [MODEL [--device AUTO:ORT,CPU]]
aioinfer --version
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import aioinfer
from aioinfer._cli_shared import (
    UsageError,
    _dims,
    _inputs,
    _ms,
    _pairs,
    _read_npy,
    device_label,
)
from aioinfer.errors import AioinferError, ServingConfigError
from aioinfer.models import default_model_path
from aioinfer.offline import compile_to_file, is_blob_file, load_model_file

_TOP1_ROWS = 8
"""How many rows of a 2-D output get their top-1 index printed."""

API_KEY_VARIABLE = "AIOINFER_API_KEY"
"""The environment variable ``aioinfer serve`` reads the API key from (unless
``--api-key`` gives one): unlike an argument, it is not shown to other users by ``ps``."""

_SERVE_OPTIONS = (
    "switch_interval",
    "max_request_bytes",
    "max_sequences",
    "header_timeout",
    "max_header_count",
    "max_header_bytes",
    "limit_concurrency",
    "backlog",
    "timeout_keep_alive",
    "ssl_certfile",
    "ssl_keyfile",
    "grpc_port",
    "memory_budget",
)
"""``aioinfer serve`` options passed to ``serve()`` when given (else its defaults)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit code.

    User errors (a bad option value, a model that cannot be read or compiled, a bad input)
    print one ``error: ...`` line to stderr and return 2.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage and the reason
        return exc.code if isinstance(exc.code, int) else 2
    if args.version:
        print(f"aioinfer {aioinfer.__version__}")
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.command == "info":
            _info(args)
        elif args.command == "compile":
            _compile(args)
        elif args.command == "serve":
            _serve(args)
        elif args.command == "bench":
            from aioinfer import bench  # imports this module's helpers

            anyio.run(bench.run, args)
        else:
            anyio.run(_run, args)
    except (AioinferError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aioinfer", description="aioinfer ONNX runtime")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("run", help="run a model on random or given inputs")
    run.add_argument(
        "model",
        nargs="?",
        type=Path,
        help="ONNX model file, or a blob of 'aioinfer compile' (default: the bundled tiny_cnn)",
    )
    run.add_argument(
        "--device",
        help="device to compile for (default: AUTO, the best installed; a blob's: its own)",
    )
    run.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="take input NAME from a .npy file (repeatable); other inputs are random",
    )
    run.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="shape of the random input NAME (repeatable); unset dynamic dims are 1",
    )
    run.add_argument("--hint", type=str.upper, choices=("LATENCY", "THROUGHPUT"))
    run.add_argument("--iterations", type=int, default=1, help="inferences to time (>= 1)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    _add_compile_parser(commands)
    info = commands.add_parser(
        "info",
        help="list devices and their properties; with MODEL, the device AUTO runs it on "
        "and why it passed over each device before that one",
    )
    info.add_argument("model", nargs="?", type=Path, metavar="MODEL", help="ONNX model file")
    info.add_argument(
        "--device",
        default="AUTO",
        help="with MODEL: AUTO, or AUTO with its own list (AUTO:ORT,CPU); default: AUTO",
    )
    serve = commands.add_parser(
        "serve", help="serve models over HTTP (Open Inference Protocol, KServe v2)"
    )
    serve.add_argument(
        "source",
        type=Path,
        metavar="REPOSITORY_OR_MODEL",
        help="a repository <repo>/<model>/<version>/model.onnx, one .onnx file, or one "
        "exporter's folder (optimum's model.onnx with its config and tokenizer files)",
    )
    serve.add_argument(
        "--model-name",
        metavar="NAME",
        help="the name of the one model served from a model file or an exporter's folder "
        "(default: the file's stem or the folder's name)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (0: any)")
    serve.add_argument(
        "--grpc-port",
        type=int,
        metavar="PORT",
        help="also serve KServe v2 gRPC on this port (0: any; default: no gRPC)",
    )
    serve.add_argument(
        "--access-log", action="store_true", help="log a line per request (uvicorn's)"
    )
    serve.add_argument(
        "--switch-interval",
        type=_positive_seconds,
        metavar="SECONDS",
        help="the interpreter's thread switch interval: how long the event loop may keep "
        "the GIL from a compute thread that waits for it (default 0.0005)",
    )
    control = serve.add_argument_group("model control (Triton's)")
    control.add_argument(
        "--model-control-mode",
        choices=["none", "explicit"],
        default="none",
        help="none: load every model at the start, refuse load/unload requests; explicit: "
        "load the --load-model models at the start, others on request (default none)",
    )
    control.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-control-mode explicit: a model to load at the start "
        "(repeatable; '*': every model)",
    )
    control.add_argument(
        "--memory-budget",
        type=_size,
        metavar="SIZE",
        help="memory the loaded models may hold (e.g. 6GiB, 512MB): models load when a "
        "request needs them, the least recently used idle ones are unloaded to make room",
    )
    _add_limit_options(serve)
    scale = serve.add_argument_group("Ray Serve (the 'ray' extra)")
    scale.add_argument(
        "--ray",
        action="store_true",
        help="serve on Ray Serve: a local Ray instance, or the cluster of $RAY_ADDRESS",
    )
    scale.add_argument(
        "--replicas", type=_positive_int, metavar="N", help="replicas of every model (--ray)"
    )
    from aioinfer import bench

    bench.add_parser(commands)
    return parser


def _add_limit_options(serve: argparse.ArgumentParser) -> None:
    limits = serve.add_argument_group("limits (defaults in parentheses)")
    limits.add_argument(
        "--max-request-bytes",
        type=_positive_int,
        metavar="BYTES",
        help="larger bodies get 413 (64 MiB)",
    )
    limits.add_argument(
        "--max-sequences",
        type=_positive_int,
        metavar="N",
        help="open sequences of a model whose config sets no max_sequences; beyond: 503 (1000)",
    )
    limits.add_argument(
        "--header-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="a request's headers must be complete this long after the connection opened "
        "or the request's first byte came (10)",
    )
    limits.add_argument(
        "--max-header-count",
        type=_positive_int,
        metavar="N",
        help="header lines; beyond: 431 (100)",
    )
    limits.add_argument(
        "--max-header-bytes",
        type=_positive_int,
        metavar="BYTES",
        help="request line and headers; beyond: 431 (32768)",
    )
    limits.add_argument(
        "--limit-concurrency",
        type=_positive_int,
        metavar="N",
        help="once N connections are open or N requests run, a request gets 503 (no limit)",
    )
    limits.add_argument(
        "--backlog",
        type=_positive_int,
        metavar="N",
        help="connections queued to be accepted (2048)",
    )
    limits.add_argument(
        "--timeout-keep-alive",
        type=_positive_int,
        metavar="SECONDS",
        help="an idle connection is closed after this long (5)",
    )
    security = serve.add_argument_group("security (off by default)")
    security.add_argument("--ssl-certfile", metavar="PEM", help="serve HTTPS: the certificate")
    security.add_argument("--ssl-keyfile", metavar="PEM", help="the certificate's private key")
    security.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"require this key (as 'Authorization: Bearer KEY' or 'X-API-Key: KEY') on "
        f"every endpoint but health; default: ${API_KEY_VARIABLE} if set",
    )
    security.add_argument(
        "--public-metrics",
        action="store_true",
        help="with an API key, leave /metrics open (for a scraper without the key)",
    )


def _add_compile_parser(commands: Any) -> None:
    compile_ = commands.add_parser(
        "compile",
        help="compile a model for a device ahead of time and write its export blob",
        description="Compile MODEL for DEVICE and write the blob that 'aioinfer run', "
        "'aioinfer serve' (as a repository's model file) and Core.import_model load "
        "without compiling again.",
    )
    compile_.add_argument("model", type=Path, metavar="MODEL", help="ONNX model file")
    compile_.add_argument("-d", "--device", required=True, help="device to compile for")
    compile_.add_argument(
        "-o", "--output", type=Path, metavar="BLOB", help="blob file (default: MODEL.blob)"
    )
    compile_.add_argument(
        "-c",
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a compile property (repeatable); VALUE is JSON when it parses as JSON "
        '(2, true, ["a", "b"], {"in": "out"}), else a string',
    )


def _compile(args: argparse.Namespace) -> None:
    pairs = _pairs(args.config, "-c", "KEY=VALUE")
    config = {key: _config_value(text) for key, text in pairs.items()}
    output = args.output if args.output is not None else args.model.with_suffix(".blob")
    start = time.perf_counter()
    compiled = compile_to_file(aioinfer.Core(), args.model, args.device, config, output)
    seconds = time.perf_counter() - start
    print(f"model:        {compiled.name} ({args.model})")
    print(f"device:       {args.device}")
    print(f"blob:         {output} ({output.stat().st_size} bytes)")
    print(f"compile time: {_ms(seconds)} (with export)")


def _config_value(text: str) -> Any:
    """A ``-c`` value: JSON when it parses (numbers, booleans, lists, objects), else the
    text itself (``THROUGHPUT``, ``CPUExecutionProvider``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _run(args: argparse.Namespace) -> None:
    if args.iterations < 1:
        raise UsageError(f"--iterations must be >= 1, got {args.iterations}")
    files = _pairs(args.input, "--input", "NAME=FILE.npy")
    shape_texts = _pairs(args.shape, "--shape", "NAME=D0,D1,...")
    shapes = {name: _dims(name, text) for name, text in shape_texts.items()}
    both = sorted(files.keys() & shapes.keys())
    if both:
        raise UsageError(f"input {both[0]!r} has both --input and --shape; give one of them")
    arrays = {name: _read_npy(name, file) for name, file in files.items()}
    model_path = args.model if args.model is not None else default_model_path()
    config = {"PERFORMANCE_HINT": args.hint} if args.hint else {}

    start = time.perf_counter()
    compiled = await load_model_file(aioinfer.Core(), model_path, args.device, config)
    compile_seconds = time.perf_counter() - start
    for name in [*files, *shapes]:
        compiled.input(name)  # raises UnknownInputError naming the inputs that exist
    inputs = _inputs(compiled.inputs, arrays, shapes, np.random.default_rng(args.seed))

    request = compiled.create_infer_request()
    latencies = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        results = await request.infer(inputs)
        latencies.append(time.perf_counter() - start)

    print(f"model:        {compiled.name} ({model_path})")
    # Without --device: a blob runs on the device it names, a model on AUTO.
    asked = args.device or ("" if _is_blob(model_path) else "AUTO")
    asked = asked or str(compiled.get_property("DEVICE_NAME"))
    print(f"device:       {device_label(asked, compiled)}")
    print(f"compile time: {_ms(compile_seconds)}")
    print("inputs:")
    for port in compiled.inputs:
        source = files.get(port.name, f"random, seed {args.seed}")
        array = inputs[port.name]
        print(f"  {port.name}: {array.dtype} {list(array.shape)} ({source})")
    print("outputs:")
    for port in compiled.outputs:
        _print_output(port.name, results[port.name])
    _print_timing(latencies, request.get_profiling_info())


def _print_output(name: str, array: np.ndarray) -> None:
    print(f"  {name}: {array.dtype} {list(array.shape)} {_summary(array)}".rstrip())
    if array.ndim == 2 and array.dtype.kind == "f" and array.size:
        top1 = array[:_TOP1_ROWS].argmax(axis=1).tolist()
        more = ", ..." if array.shape[0] > _TOP1_ROWS else ""
        print(f"    top-1 per row: [{', '.join(map(str, top1))}{more}]")


def _print_timing(latencies: list[float], profiling: list[dict[str, Any]]) -> None:
    if len(latencies) == 1:
        print(f"latency:      {_ms(latencies[0])}")
    else:
        print(
            f"latency:      first {_ms(latencies[0])}, median "
            f"{_ms(statistics.median(latencies))} over {len(latencies)} iterations"
        )
    stages = [e for e in profiling if e.get("type") == "stage"]
    print("stages:       " + ", ".join(f"{e['name']} {_ms(e['seconds'])}" for e in stages))


def _serve(args: argparse.Namespace) -> None:
    try:
        from aioinfer.serving import serve
        from aioinfer.serving.repository import ModelRepository
    except ImportError as exc:
        raise UsageError(
            f"aioinfer serve needs the 'serve' extra ({exc.name} is missing): "
            "pip install 'aioinfer[serve]'"
        ) from None
    options = {name: getattr(args, name) for name in _SERVE_OPTIONS}
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE)
    if args.ray or args.replicas is not None:
        _serve_on_ray(args, options, api_key)
        return
    source: Path | ModelRepository = args.source  # a repository: a named single model
    if args.model_name is not None:
        source = ModelRepository(args.source, model_name=args.model_name)
    serve(
        source,
        host=args.host,
        port=args.port,
        access_log=args.access_log,
        api_key=api_key,
        public_metrics=args.public_metrics,
        model_control_mode=args.model_control_mode,
        load_models=args.load_model,
        **{name: value for name, value in options.items() if value is not None},
    )


_RAY_OPTIONS = ("max_request_bytes", "max_sequences", "memory_budget")
"""``aioinfer serve`` options that ``--ray`` takes too (Ray's proxy owns the connections)."""


def _serve_on_ray(args: argparse.Namespace, options: dict[str, Any], api_key: str | None) -> None:
    if not args.ray:
        raise UsageError("--replicas needs --ray")
    unsupported = [name for name, value in options.items() if value is not None]
    unsupported = [name for name in unsupported if name not in _RAY_OPTIONS]
    if args.access_log:
        unsupported.append("access_log")
    if unsupported:
        names = ", ".join("--" + name.replace("_", "-") for name in unsupported)
        raise UsageError(f"{names}: not available with --ray (Ray Serve's proxy serves HTTP)")
    try:
        from aioinfer import ray as on_ray
    except ImportError as exc:
        raise UsageError(
            f"aioinfer serve --ray needs the 'ray' extra ({exc.name} is missing): "
            "pip install 'aioinfer[ray]'"
        ) from None
    on_ray.run(
        args.source,
        host=args.host,
        port=args.port,
        num_replicas=args.replicas,
        api_key=api_key,
        public_metrics=args.public_metrics,
        **{name: options[name] for name in _RAY_OPTIONS if options[name] is not None},
    )


def _is_blob(path: Path) -> bool:
    try:
        return is_blob_file(path)
    except OSError:
        return False


def _info(args: argparse.Namespace) -> None:
    from aioinfer.devices.auto.plugin import unavailable_reason

    core = aioinfer.Core()
    if args.model is not None:
        _auto_choice(core, args.model, args.device)
        return
    available = []
    for device in core.available_devices:
        reason = unavailable_reason(core, device)
        if reason is not None:
            print(f"{device} (not available: {reason})")
            continue
        available.append(device)
        print(device)
        names = core.get_property(device, "SUPPORTED_PROPERTIES")
        for name in names:
            try:
                value = core.get_property(device, name)
            except AioinferError:  # a compile-time property: no device-level value
                print(f"  {name} (per compiled model)")
                continue
            shown = ", ".join(value) if isinstance(value, (list, tuple)) else value
            print(f"  {name}: {shown}")
    print(f"available here: {', '.join(available)}")


def _auto_choice(core: aioinfer.Core, path: Path, device: str) -> None:
    """Print the device AUTO compiles the model at ``path`` on, and why it passed over
    each device of its list before that one.

    Raises:
        UsageError: ``device`` is not AUTO.
        The errors of :meth:`Core.compile_model` (AUTO's names every device's reason).
    """
    if device.partition(":")[0] != "AUTO":
        raise UsageError(f"info MODEL explains AUTO's choice: --device AUTO[:LIST], not {device!r}")
    compiled = core.compile_model(core.read_model(path), device)
    chosen = compiled.get_property("EXECUTION_DEVICES")[0]
    print(f"model {compiled.name!r} ({path})")
    for passed, reason in compiled.get_property("PASSED_OVER_DEVICES"):
        print(f"{passed}: passed over: {reason}")
    print(f"{chosen}: chosen")


def _positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return seconds


def _size(text: str) -> int:
    """An argparse type: a size in bytes (``6GiB``, ``512MB``, ``1000000``)."""
    from aioinfer.serving.repository import parse_bytes

    try:
        return parse_bytes(text, "--memory-budget")
    except ServingConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}")
    return value


def _summary(array: np.ndarray) -> str:
    if array.size == 0 or array.dtype.kind not in "biuf":
        return ""
    values = array.astype(np.float64)
    return f"min {values.min():.6g} max {values.max():.6g} mean {values.mean():.6g}"


if __name__ == "__main__":
    raise SystemExit(main())
