"""How fast could numpy run a model at best? The matrix products' floor against onnxruntime.

    python -m benchmarks.numpy_floor [--models mlp,resnet18,orientation,...] [--runs 10]

For each model of :mod:`benchmarks.compare` and :mod:`benchmarks.real_models` (those
whose package is installed), onnxruntime runs it once with profiling on (basic graph
optimisations, so that its nodes keep the model's operators) to learn the shapes every
``Conv``, ``MatMul``, ``Gemm``, ``LSTM`` and ``GRU`` computes on. Each such product is
then timed alone in numpy, with every favour granted: its operands already laid out as
one matrix product (no im2col copy, no epilogue, the output preallocated), the best of
OpenBLAS on one thread halved (a perfect split over two cores) and OpenBLAS on two
threads. A depthwise convolution, which BLAS cannot do as one product, gets the cheaper
of one multiply-add per kernel tap over contiguous planes (two numpy passes a tap, the
window gathering free) and a batched matrix product per channel over ready-made
columns. A recurrent layer gets the input projection of all steps as one product, then
per step, one after the other, its product and the fewest numpy calls of its gates
(:data:`STEP_CALLS`); a forward LSTM stacked on another shares the calls of that one's
steps (:func:`stacked`).

The sum of those times is a floor for any numpy implementation of the model's products
alone; everything else (activations, normalisations, pooling, reshapes, per-call
overhead) is taken as free. Reported beside onnxruntime's whole inference (2 intra-op
threads, all optimisations, median of ``--runs``): a floor ratio above a target means no
numpy kernel can reach it on this machine; below it, the room left lies outside the
products.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks import compare, real_models

PRODUCTS = ("Conv", "MatMul", "Gemm", "LSTM", "GRU")
GATES = {"LSTM": 4, "GRU": 3}
STEP_CALLS = 8
"""The fewest numpy calls an LSTM step makes besides its product (a GRU's are as many),
each on arrays of at least batch x hidden (timed at that size): adding the step's input
projection; one tanh over all four gates (the sigmoid gates' weights prescaled by 1/2);
the affine pass that makes sigmoids of three of them (two calls: numpy has no fused
multiply-add); the state update f c + i g (three calls); the output o tanh(c) (two
calls) — nine, one fewer granted for a fusion found later."""


@dataclass(frozen=True)
class Product:
    """One product node of a run: its operator, input shapes and attributes we need."""

    op: str
    first: tuple[int, ...]
    """The shape of the first input (X of a Conv, A of a product)."""
    output: tuple[int, ...]
    kernel: tuple[int, ...] = ()
    """A Conv's kernel's spatial shape."""
    group: int = 1
    trans_a: bool = False


def load(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]] | None:
    """The model and its benchmark inputs, or None when its package is missing."""
    if name in compare.MODELS:
        model = compare.MODELS[name][0]()
        return model, compare.feeds_for(name, model)
    case = real_models.CASES[name]
    path = real_models.locate(case)
    if path is None:
        return None
    return onnx.load(path), case.feeds(np.random.default_rng(0))


def products(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[Product]:
    """The products one inference computes, from onnxruntime's profile (basic
    optimisations: constants folded, operators kept); nodes inside a Loop count once
    per iteration they ran."""
    import onnxruntime as ort

    attributes = _attributes(model.graph)
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "floor")
        options.log_severity_level = 3
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        session.run(None, dict(feeds))
        events = json.loads(Path(session.end_profiling()).read_text())
    found = []
    for event in events:
        args = event.get("args", {})
        if event.get("cat") != "Node" or args.get("op_name") not in PRODUCTS:
            continue
        if not event["name"].endswith("_kernel_time"):
            continue
        # (the profile leaves out the weights onnxruntime packed ahead)
        first = tuple(next(iter(args["input_type_shape"][0].values())))
        output = tuple(next(iter(args["output_type_shape"][0].values())))
        node = attributes.get(event["name"].removesuffix("_kernel_time"), {})
        found.append(
            Product(
                args["op_name"],
                first,
                output,
                kernel=tuple(node.get("kernel_shape", ())),
                group=int(node.get("group", 1)),
                trans_a=bool(node.get("transA", 0)),
            )
        )
    return found


def _attributes(graph: onnx.GraphProto) -> dict[str, dict[str, Any]]:
    """Attributes of the graph's named nodes, subgraphs included; a Conv without
    ``kernel_shape`` gets its weight's spatial shape."""
    weights = {init.name: tuple(init.dims) for init in graph.initializer}
    found: dict[str, dict[str, Any]] = {}
    for node in graph.node:
        values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv" and "kernel_shape" not in values:
            values["kernel_shape"] = weights.get(node.input[1], (0, 0, 1))[2:]
        found[node.name] = values
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                found.update(_attributes(attribute.g))
    return found


def floor_seconds(
    product: Product, cache: dict[tuple[Product, bool], float], in_stack: bool = False
) -> float:
    """numpy's best time for ``product`` (see the module's docstring)."""
    if (product, in_stack) not in cache:
        cache[product, in_stack] = _floor(product, in_stack)
    return cache[product, in_stack]


def _floor(product: Product, in_stack: bool) -> float:
    a, output = product.first, product.output
    if product.op == "Conv":
        n, channels, filters = a[0], a[1], output[1]
        out = math.prod(output[2:])
        taps = math.prod(product.kernel)
        group = product.group
        if group > 1 and group == channels == filters:
            return _depthwise(n, channels, out, taps)
        return _gemm(n * group, filters // group, (channels // group) * taps, out)
    if product.op == "Gemm":
        return _gemm(1, output[0], a[0] if product.trans_a else a[1], output[1])
    if product.op in GATES:
        return _recurrent(a, output, GATES[product.op], in_stack)
    if len(output) < 2:  # a vector product
        return _gemm(1, 1, a[-1], output[-1] if output else 1)
    return _gemm(math.prod(output[:-2]), output[-2], a[-1], output[-1])


def _recurrent(x: tuple[int, ...], y: tuple[int, ...], gates: int, stacked: bool) -> float:
    """An LSTM's or GRU's products: the input projection of all steps as one product, and
    each step's product of the hidden state, one after the other (the directions of a
    bidirectional layer on the two cores). A ``stacked`` layer (a forward LSTM over the
    steps of the forward LSTM before it) shares that layer's calls: the wavefront of
    ``LSTMStack`` runs the gates of both in the same calls."""
    steps, batch, size = x
    directions, hidden = y[1], y[-1]
    projection = _gemm(1, steps * batch, size, directions * gates * hidden)
    calls = 0 if stacked else STEP_CALLS * _call(batch * hidden)
    step = _gemm_one_thread(1, batch, hidden, gates * hidden) + calls
    return projection + steps * step * directions / min(directions, 2)


def stacked(found: list[Product]) -> list[bool]:
    """Per product, whether it is a forward LSTM layer right after another over the same
    steps and batch (a stack :mod:`aioinfer.devices.cpu.passes.fuse_lstm_stack` fuses)."""
    flags = []
    below: Product | None = None
    for product in found:
        forward = product.op == "LSTM" and product.output[1] == 1
        flags.append(
            forward
            and below is not None
            and below.first[:2] == product.first[:2]
            and below.output[-1] == product.first[-1]
        )
        below = product if forward else None
    return flags


def _call(size: int) -> float:
    """One numpy call on ``size`` float32 elements, output preallocated."""
    a = np.ones(size, np.float32)
    out = np.empty_like(a)
    return _best(lambda: np.add(a, a, out=out), repeats=50)


def _best(run: Callable[[], object], repeats: int = 7) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _gemm(batch: int, m: int, k: int, n: int) -> float:
    """``batch`` products (m x k) @ (k x n), output preallocated: the best of one BLAS
    thread halved and two BLAS threads."""
    return min(_product(batch, m, k, n, 1) / 2, _product(batch, m, k, n, 2))


def _gemm_one_thread(batch: int, m: int, k: int, n: int) -> float:
    """``batch`` products (m x k) @ (k x n) on one BLAS thread (work too small to split)."""
    return _product(batch, m, k, n, 1)


def _product(batch: int, m: int, k: int, n: int, threads: int) -> float:
    """The best time of ``batch`` products (m x k) @ (k x n) into a preallocated output,
    on ``threads`` BLAS threads."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    out = np.empty((batch, m, n), np.float32)
    with threadpool_limits(threads, user_api="blas"):
        return _best(lambda: np.matmul(a, b, out=out))


def _depthwise(n: int, channels: int, out: int, taps: int) -> float:
    """A depthwise convolution's floor: the cheaper of a multiply-add per tap over
    contiguous planes and a per-channel batched product over ready columns, halved
    (two cores)."""
    rng = np.random.default_rng(0)
    plane = rng.standard_normal((n, channels, out)).astype(np.float32)
    weights = rng.standard_normal((taps, 1, channels, 1)).astype(np.float32)
    total = np.empty_like(plane)
    scratch = np.empty_like(plane)

    def per_tap() -> None:
        np.multiply(plane, weights[0], out=total)
        for tap in range(1, taps):
            np.multiply(plane, weights[tap], out=scratch)
            np.add(total, scratch, out=total)

    columns = rng.standard_normal((n * channels, out, taps)).astype(np.float32)
    kernel = rng.standard_normal((n * channels, taps, 1)).astype(np.float32)
    result = np.empty((n * channels, out, 1), np.float32)
    batched = _best(lambda: np.matmul(columns, kernel, out=result))
    return min(_best(per_tap), batched) / 2


def onnxruntime_seconds(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], runs: int
) -> float:
    """onnxruntime's median inference (2 intra-op threads, all optimisations), timed
    after a pause: OpenBLAS's threads of the floors' two-thread products spin for a while
    after their last call, and onnxruntime's threads would share the cores with them
    (PP-LCNet's inference took 6.4 instead of 1.3 ms right after its floors)."""
    run = real_models.onnxruntime_runner(model)
    time.sleep(0.5)
    for _ in range(10):
        run(feeds)
    return statistics.median(compare.timed(lambda: run(feeds), runs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [*compare.MODELS, *real_models.CASES]
    parser.add_argument("--models", default=",".join(names), help="comma-separated names")
    parser.add_argument("--runs", type=int, default=10, help="onnxruntime's timed runs")
    args = parser.parse_args(argv)
    print(f"machine: {compare.machine()}")
    print(
        "| model | products | onnxruntime ms | numpy floor of the products ms | "
        "floor / onnxruntime |"
    )
    print("|---|---:|---:|---:|---:|")
    ratios = []
    cache: dict[tuple[Product, bool], float] = {}
    for name in args.models.split(","):
        loaded = load(name)
        if loaded is None:
            print(f"| {name} | (package not installed) | | | |")
            continue
        model, feeds = loaded
        theirs = onnxruntime_seconds(model, feeds, args.runs)
        found = products(model, feeds)
        floor = sum(floor_seconds(p, cache, s) for p, s in zip(found, stacked(found)))
        if floor > 0:
            ratios.append(floor / theirs)
        print(
            f"| {name} | {len(found)} | {theirs * 1e3:.3f} | {floor * 1e3:.3f} | "
            f"{floor / theirs:.2f} |",
            flush=True,
        )
    if ratios:
        print(f"geometric mean of the floor ratios: {compare.geomean(ratios):.2f}")


if __name__ == "__main__":
    main()
