"""Per-step cost of variable state on CPU: its native variables against the layer above
the device.

    python -m benchmarks.state_step [--rounds 20] [--backend asyncio|trio]

The CPU device keeps its variables natively (inputs and outputs of its plan); every
device that does not gets them from :mod:`aioinfer.plugin.stateful`, which this runs on
CPU too (``compile_stateful`` on the CPU plugin). A third variant feeds the state by hand
to the model compiled without ``STATEFUL`` (the control: no state bookkeeping at all).
The variants take turns, ``--rounds`` rounds of ``STEPS`` steps each, so that a change
of the machine's load hits all three; it prints the median microseconds of one
``await request.infer(...)`` step (and of ``infer_sync``). The KV cache starts again
every ``STEPS`` steps, so its length stays bounded.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import anyio
import numpy as np
import onnx

import aioinfer as ai
from aioinfer.plugin.stateful import compile_stateful
from benchmarks import models

STEPS = 32


class Variant:
    """One way to run the steps, and its per-step times."""

    def __init__(self, name: str, compiled: ai.CompiledModel, by_hand: str | None) -> None:
        self.name = name
        self.request = compiled.create_infer_request()
        self.by_hand = by_hand
        """The (input, output) pair fed by hand, as ``"past->present"``; None: variables."""
        self.state: np.ndarray | None = None
        self.times: list[float] = []
        self.sync_times: list[float] = []

    def feed(self, x: np.ndarray) -> dict[str, np.ndarray]:
        if self.by_hand is None:
            return {"x": x}
        name = self.by_hand.split("->")[0]
        assert self.state is not None
        return {"x": x, name: self.state}

    def keep(self, results: ai.InferResults) -> None:
        if self.by_hand is not None:
            self.state = results[self.by_hand.split("->")[1]]

    def restart(self, initial: np.ndarray) -> None:
        if self.by_hand is None:
            self.request.reset_state()
        else:
            self.state = initial


async def run_round(variant: Variant, xs: list[np.ndarray], initial: np.ndarray) -> None:
    variant.restart(initial)
    for x in xs:
        start = time.perf_counter()
        variant.keep(await variant.request.infer(variant.feed(x)))
        variant.times.append(time.perf_counter() - start)
    variant.restart(initial)
    for x in xs:
        start = time.perf_counter()
        variant.keep(variant.request.infer_sync(variant.feed(x)))
        variant.sync_times.append(time.perf_counter() - start)


async def measure(
    name: str, model: onnx.ModelProto, x: Callable[[int], np.ndarray], initial: np.ndarray
) -> None:
    core = ai.Core()
    pairs = core.compile_model(model, "CPU", {"STATEFUL": "auto"}).get_property("STATEFUL")
    (pair,) = pairs.items()
    variants = [
        Variant("native", core.compile_model(model, "CPU", {"STATEFUL": "auto"}), None),
        Variant(
            "layer",
            compile_stateful(core.get_plugin("CPU"), core.read_model(model), {"STATEFUL": "auto"}),
            None,
        ),
        Variant("by hand", core.compile_model(model, "CPU"), "->".join(pair)),
    ]
    xs = [x(i) for i in range(STEPS)]
    for variant in variants:  # warm up: memory plans, caches
        await run_round(variant, xs, initial)
        variant.times.clear()
        variant.sync_times.clear()
    for _ in range(ARGS.rounds):
        for variant in variants:
            await run_round(variant, xs, initial)
    print(f"\n{name}: median microseconds per step ({len(variants[0].times)} steps each)")
    print(f"  {'variant':<10} {'infer()':>10} {'infer_sync':>11}")
    for variant in variants:
        asynchronous = statistics.median(variant.times) * 1e6
        synchronous = statistics.median(variant.sync_times) * 1e6
        print(f"  {variant.name:<10} {asynchronous:>10.1f} {synchronous:>11.1f}")


async def main() -> None:
    rng = np.random.default_rng(0)
    await measure(
        "GRU step (32 -> 64, batch 1)",
        models.gru_step(),
        lambda i: rng.standard_normal((1, 1, 32)).astype(np.float32),
        np.zeros((1, 1, 64), np.float32),
    )
    await measure(
        f"KV-cache step (width 64, batch 1, cache 0..{STEPS})",
        models.kv_cache_step(),
        lambda i: rng.standard_normal((1, 1, 64)).astype(np.float32),
        np.zeros((1, 0, 64), np.float32),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    ARGS = parser.parse_args()
    anyio.run(main, backend=ARGS.backend)
