"""Control flow: If, Loop and Scan run their subgraphs as sub-plans.

The compiler lowers each graph attribute with the same machinery as the top-level graph
(:func:`aioinfer.devices.cpu.compiler.lower`) and hands the plans to the factory in
``spec.subplans``. Values a body reads from an enclosing graph arrive as extra kernel
inputs after the node's own (``inputs[spec.num_inputs:]``) and are passed on to every
body run. Bodies run with the cancel token of the running plan, and the loops check it
before each iteration, so cancelling an inference stops inside a long loop too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from aioinfer.devices.cpu.kernels.registry import Kernel, NodeSpec, kernel
from aioinfer.devices.cpu.plan import Plan, current_cancel_token, stop_if_cancelled
from aioinfer.devices.cpu.specialize import may_specialize, specialized_run


def _flag(value: Any) -> bool:
    """A condition tensor (one element) as a Python bool."""
    return bool(np.asarray(value).reshape(-1)[0])


def _stacked(parts: Sequence[np.ndarray], dtype: np.dtype | None) -> np.ndarray:
    """Per-iteration outputs stacked along a new first axis (an empty array for none)."""
    if parts:
        return np.stack(parts)
    return np.empty((0,), dtype=dtype or np.float32)


@kernel("If", since=1)
def _if(spec: NodeSpec) -> Kernel:
    then_plan: Plan = spec.subplans["then_branch"]
    else_plan: Plan = spec.subplans["else_branch"]
    # A branch that reads shapes or branches again runs its version specialised for the
    # shapes it is given (see specialize.py); any other one runs as it is.
    then_run = specialized_run if may_specialize(then_plan) else Plan.run_steps
    else_run = specialized_run if may_specialize(else_plan) else Plan.run_steps

    def run(cond: np.ndarray, *captured: Any) -> Sequence[Any]:
        if _flag(cond):
            return then_run(then_plan, captured, current_cancel_token())
        return else_run(else_plan, captured, current_cancel_token())

    return run


_TRUE = np.array(True)
_TRUE.flags.writeable = False


@kernel("Loop", since=1)
def _loop(spec: NodeSpec) -> Kernel:
    body: Plan = spec.subplans["body"]
    carried_count = spec.num_inputs - 2
    scan_count = len(body.output_slots) - 1 - carried_count
    scan_dtypes = spec.output_dtypes[carried_count:] or (None,) * scan_count
    run_body = body.run_steps  # bound once; the caller's token is the thread's already

    def run(trip_count: Any, cond: Any, *rest: Any) -> tuple[Any, ...]:
        carried: Sequence[Any] = rest[:carried_count]
        captured = rest[carried_count:]
        limit = None if trip_count is None else int(np.asarray(trip_count).reshape(-1)[0])
        going = True if cond is None else _flag(cond)
        token = current_cancel_token()
        scans: list[list[np.ndarray]] = [[] for _ in range(scan_count)]
        iteration = 0
        while going and (limit is None or iteration < limit):
            stop_if_cancelled(token)
            outputs = run_body((np.array(iteration, np.int64), _TRUE, *carried, *captured), token)
            going = _flag(outputs[0])
            carried = outputs[1 : 1 + carried_count]
            for parts, value in zip(scans, outputs[1 + carried_count :]):
                parts.append(value)
            iteration += 1
        return (*carried, *(_stacked(p, d) for p, d in zip(scans, scan_dtypes)))

    return run


def _axes(values: Sequence[int] | None, count: int) -> list[int]:
    return list(values) if values else [0] * count


def _scan(
    body: Plan,
    states: list[Any],
    scans: list[np.ndarray],
    captured: list[Any],
    output_axes: list[int],
    output_directions: list[int],
    output_dtypes: Sequence[np.dtype | None],
) -> tuple[Any, ...]:
    """Run ``body`` over the first axis of ``scans`` (already moved and reversed)."""
    state_count = len(states)
    length = scans[0].shape[0] if scans else 0
    if any(x.shape[0] != length for x in scans):
        raise ValueError(
            f"Scan inputs disagree on the sequence length: {[x.shape[0] for x in scans]}"
        )
    token = current_cancel_token()
    collected: list[list[np.ndarray]] = [[] for _ in output_axes]
    for step in range(length):
        stop_if_cancelled(token)
        outputs = body.run_steps([*states, *(x[step] for x in scans), *captured], token)
        states = list(outputs[:state_count])
        for parts, value in zip(collected, outputs[state_count:]):
            parts.append(value)
    results = []
    for parts, axis, direction, dtype in zip(
        collected, output_axes, output_directions, output_dtypes
    ):
        stacked = _stacked(parts, dtype)
        if direction:
            stacked = stacked[::-1]
        results.append(np.moveaxis(stacked, 0, axis if axis >= 0 else axis + stacked.ndim))
    return (*states, *results)


@kernel("Scan", since=9)
def _scan9(spec: NodeSpec) -> Kernel:
    body: Plan = spec.subplans["body"]
    scan_count = int(spec.attr("num_scan_inputs"))
    state_count = spec.num_inputs - scan_count
    out_count = len(body.output_slots) - state_count
    input_axes = _axes(spec.attr("scan_input_axes"), scan_count)
    input_directions = _axes(spec.attr("scan_input_directions"), scan_count)
    output_axes = _axes(spec.attr("scan_output_axes"), out_count)
    output_directions = _axes(spec.attr("scan_output_directions"), out_count)
    output_dtypes = spec.output_dtypes[state_count:] or (None,) * out_count

    def run(*inputs: Any) -> tuple[Any, ...]:
        scans = []
        for x, axis, direction in zip(
            inputs[state_count : spec.num_inputs], input_axes, input_directions
        ):
            moved = np.moveaxis(x, axis if axis >= 0 else axis + x.ndim, 0)
            scans.append(moved[::-1] if direction else moved)
        return _scan(
            body,
            list(inputs[:state_count]),
            scans,
            list(inputs[spec.num_inputs :]),
            output_axes,
            output_directions,
            output_dtypes,
        )

    return run


@kernel("Scan", since=8)
def _scan8(spec: NodeSpec) -> Kernel:
    """Scan-8: every input has a batch axis first and the sequence axis second;
    ``sequence_lens`` (optional) bounds each batch entry's sequence."""
    body: Plan = spec.subplans["body"]
    scan_count = int(spec.attr("num_scan_inputs"))
    state_count = spec.num_inputs - 1 - scan_count
    out_count = len(body.output_slots) - state_count
    directions = _axes(spec.attr("directions"), scan_count)
    output_dtypes = spec.output_dtypes[state_count:] or (None,) * out_count

    def run(sequence_lens: np.ndarray | None, *inputs: Any) -> tuple[Any, ...]:
        states = inputs[:state_count]
        scans = inputs[state_count : spec.num_inputs - 1]
        captured = list(inputs[spec.num_inputs - 1 :])
        batch = (states[0] if states else scans[0]).shape[0]
        length = scans[0].shape[1]
        per_batch = []
        for b in range(batch):
            steps = length if sequence_lens is None else int(sequence_lens[b])
            sliced = [x[b, :steps] for x in scans]
            sliced = [x[::-1] if d else x for x, d in zip(sliced, directions)]
            per_batch.append(
                _scan(
                    body,
                    [s[b] for s in states],
                    sliced,
                    captured,
                    [0] * out_count,
                    [0] * out_count,
                    output_dtypes,
                )
            )
        results = []
        for index in range(state_count + out_count):
            parts = [outputs[index] for outputs in per_batch]
            if index >= state_count:
                # Entries shorter than the longest sequence are padded with zeros.
                padded = np.zeros((length, *parts[0].shape[1:]), parts[0].dtype)
                parts = [np.concatenate([p, padded[p.shape[0] :]]) for p in parts]
            results.append(np.stack(parts))
        return tuple(results)

    return run
