"""Specialisation: a plan rewritten for one set of input shapes, on its first run with them.

Exported models compute shapes at run time: ``Shape -> Gather -> Equal -> If`` chains
choose whether to squeeze an axis, ``Shape -> Concat -> ConstantOfShape`` builds an
initial state. For given input shapes those values never change, yet every inference
pays a kernel call for each of them and a sub-plan run (a fresh slot list, a thread-local
token) for each such ``If``: Silero VAD runs about 75 kernels, a third of them this kind.

:func:`specialize` runs a plan once, step by step, and tracks which values the input
shapes alone fix:

- a *static value*: a constant; the output of ``Shape`` or ``Size`` whose input has a
  static shape; every output of a deterministic step whose inputs are all static. Such
  a step is *folded*: its outputs become constants of the specialised plan and the step
  is dropped (unless an output is larger than :data:`FOLD_BYTES`);
- a *static shape*: every array input of the plan; the outputs of a step whose output
  shapes follow from its inputs' shapes (:data:`SHAPE_FROM_SHAPES`), or from its inputs'
  shapes and the values of some inputs when those are static (:data:`SHAPE_FROM_VALUES`).

An ``If`` whose condition is a static value is replaced by the steps of the branch it
takes, specialised in turn (nested shape-dependent ``If``s all disappear), and an
``Identity`` by its input. A request's plan also *speculates* on an ``If`` on data
(Silero VAD's on the sample rate it is given, always the same in practice): it inlines
the branch taken, behind a guard step; when a later run takes the other branch, the
guard raises :class:`~.plan.BranchChanged` and the request specialises again without
speculation (once: a condition that changed may change again). ``Loop``,
``Scan`` and an ``If`` on data stay single steps; such an ``If`` specialises the branch
it runs per shapes of the values it passes (:func:`specialized_run`, cached on the
branch's plan).

The specialised plan gives the same results as the original on any inputs of those
shapes: every dropped step would have produced the same values, every inlined branch is
the one the original would have taken. The request keys its memory plan by input shapes
already (see :mod:`.memory`), so the specialised plan is what it binds to its buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

from aioinfer.devices.cpu.memory import shapes_key
from aioinfer.devices.cpu.plan import (
    NONE_SLOT,
    SCRATCH_SLOT,
    BranchChanged,
    Observer,
    Plan,
    Step,
    releases,
    swap_cancel_token,
)
from aioinfer.errors import InferCancelledError, InferenceError
from aioinfer.plugin.sync_request import CancelToken
from aioinfer.transforms.constant_folding import NONDETERMINISTIC

FOLD_BYTES = 1 << 16
"""A static value larger than this stays computed at run time (a specialised plan holds
its folded values for as long as the request keeps it)."""

MAX_SPECIALIZED = 16
"""Shapes a sub-plan keeps a specialised version for (beyond: forgotten, made again)."""

"""Operators whose outputs differ between runs on the same inputs: never folded."""

SHAPE_READERS = frozenset({"Shape", "Size"})
"""Operators whose output depends only on their input's shape."""

SHAPE_FROM_SHAPES = frozenset(
    """Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool
    BatchNormalization BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Cast CastLike
    Ceil Celu Clip Concat Conv ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear
    Div Dropout Einsum Elu Equal Erf Exp Flatten Floor FusedConv FusedGemm FusedMatMul GRU
    Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool
    Greater GreaterOrEqual GroupNormalization HardSigmoid HardSwish Hardmax Identity
    InstanceNormalization IsInf IsNaN LRN LSTM LayerNormalization LeakyRelu Less
    LessOrEqual Log LogSoftmax LpNormalization LpPool MatMul Max MaxPool Mean
    MeanVarianceNormalization Min Mish Mod Mul Neg Not Or PRelu Pow QuantizeLinear RNN
    Reciprocal Relu Round Selu Shape Shrink Sigmoid Sign Sin Sinh Size Softmax Softplus
    Softsign SpaceToDepth Sqrt Sub Sum Swish Tan Tanh ThresholdedRelu Transpose Trilu Where
    Xor""".split()  # noqa: SIM905
)
"""Operators whose output shapes follow from their input shapes (and attributes)."""

_REDUCE = "L1 L2 LogSum LogSumExp Max Mean Min Prod Sum SumSquare".split()  # noqa: SIM905

SHAPE_FROM_VALUES: dict[str, tuple[int, ...]] = {
    "ConstantOfShape": (0,),
    "Expand": (1,),
    "OneHot": (1,),
    "Pad": (1, 3),
    "Range": (0, 1, 2),
    "Reshape": (1,),
    "Resize": (1, 2, 3),
    "Slice": (1, 2, 3, 4),
    "Split": (1,),
    "Squeeze": (1,),
    "Tile": (1,),
    "TopK": (1,),
    "Unsqueeze": (1,),
    "Upsample": (1,),
    **{f"Reduce{kind}": (1,) for kind in _REDUCE},
}
"""Operators whose output shapes follow from their input shapes and the values of the
inputs listed (a new shape, axes, pads, repeats, ...)."""


@dataclass
class Specialization:
    """What a specialising run made: the plan, the run's outputs, and what every step of
    the plan produced as its first output (for the memory planner)."""

    plan: Plan
    outputs: list[Any]
    first_outputs: list[Any]


class _Builder:
    """The state of one specialising run: values, what is static, the steps kept."""

    def __init__(self, plan: Plan, cancel: CancelToken, observe: Observer | None) -> None:
        self.cancel = cancel
        self.observe = observe
        self.next_slot = plan.num_slots
        self.constants: list[tuple[int, np.ndarray]] = list(plan.constants)
        self.values: dict[int, Any] = {NONE_SLOT: None}
        self.static_value: set[int] = {NONE_SLOT}
        self.static_shape: set[int] = {NONE_SLOT}
        self.aliased: set[int] = set()
        """Slots two names share (a branch output that is one of its inputs): kept."""
        self.owner: dict[int, tuple[int, int]] = {}
        """slot -> (the scope that made it, its name there): who may free it early."""
        self.scopes = 0
        """Scopes opened: 0 is the plan's own, each inlined branch opens one."""
        self.steps: list[tuple[Step, tuple[int, ...], tuple[int, ...], str]] = []
        """The kept steps, with their inputs and outputs in this run's slots, and the Ifs
        they were inlined from."""
        self.first_outputs: list[Any] = []
        self.started = perf_counter()
        self.speculate = False
        """Inline the branch an ``If`` on data takes now, behind a guard step."""

    def fresh(self) -> int:
        self.next_slot += 1
        return self.next_slot - 1

    def walk(
        self, steps: Sequence[Step], where: dict[int, int], scope: int, within: str = ""
    ) -> None:
        """Run ``steps`` (slots named as in their plan; ``where`` maps the names to this
        run's slots, in ``scope``; ``within``: the Ifs they were inlined from, for error
        messages) and keep those that are neither folded nor inlined."""
        for step in steps:
            if self.cancel.requested:
                raise InferCancelledError("the inference was cancelled")
            ins = tuple(where[s] for s in step.inputs)
            if step.op_type == "If" and step.subplans and ins[0] in self.static_value:
                self.inline(step, ins, where, within)
                continue
            if step.op_type == "If" and step.subplans and self.speculate:
                self.guard(step, ins[0], within)
                self.inline(step, ins, where, within)
                continue
            if step.op_type == "Identity" and len(ins) == 1 and step.outputs[0] != SCRATCH_SLOT:
                where[step.outputs[0]] = ins[0]  # its readers read the input itself
                self.aliased.add(ins[0])
                continue
            try:
                produced = step.kernel(*[self.values[i] for i in ins])
            except InferCancelledError:
                raise
            except Exception as exc:
                raise InferenceError(
                    f"{within}node {step.name!r} ({step.op_type}) failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            outs = []
            for name in step.outputs:
                if name == SCRATCH_SLOT:
                    outs.append(SCRATCH_SLOT)
                    continue
                slot = self.fresh() if scope else name
                where[name] = slot
                self.owner[slot] = (scope, name)
                outs.append(slot)
            for slot, value in zip(outs, produced):
                if slot != SCRATCH_SLOT:
                    self.values[slot] = value
            if self.folds(step, ins, produced):
                for slot, value in zip(outs, produced):
                    if slot != SCRATCH_SLOT:
                        value.flags.writeable = False
                        self.constants.append((slot, value))
                        self.static_value.add(slot)
                        self.static_shape.add(slot)
            else:
                self.steps.append((step, ins, tuple(outs), within))
                self.first_outputs.append(produced[0] if len(produced) else None)
                if self.keeps_shape(step, ins):
                    self.static_shape.update(outs)
                self.tick(step, produced)
            for name in step.release:
                slot = where.get(name, -1)
                mine = self.owner.get(slot) == (scope, name)
                if mine and slot not in self.aliased and slot not in self.static_value:
                    self.values.pop(slot, None)

    def inline(self, step: Step, ins: tuple[int, ...], where: dict[int, int], within: str) -> None:
        """Run the branch an ``If`` with a static condition takes, as steps of this plan."""
        taken = bool(np.asarray(self.values[ins[0]]).reshape(-1)[0])
        branch = step.subplans["then_branch" if taken else "else_branch"]
        inner: dict[int, int] = {NONE_SLOT: NONE_SLOT, SCRATCH_SLOT: SCRATCH_SLOT}
        for name, array in branch.constants:
            slot = self.fresh()
            inner[name] = slot
            self.constants.append((slot, array))
            self.values[slot] = array
            self.static_value.add(slot)
            self.static_shape.add(slot)
        for name, slot in zip(branch.input_slots, ins[1:]):
            inner[name] = slot
        self.scopes += 1
        self.walk(branch.steps, inner, self.scopes, f"{within}node {step.name!r} (If): ")
        for name, result in zip(step.outputs, branch.output_slots):
            if name != SCRATCH_SLOT:
                slot = inner[result]
                where[name] = slot
                self.aliased.add(slot)

    def guard(self, step: Step, cond: int, within: str) -> None:
        """Keep a step that checks that the ``If`` ``step`` takes the branch it takes now."""
        taken = bool(np.asarray(self.values[cond]).reshape(-1)[0])
        check = Step(_guard(taken, step.name), (cond,), (), (), step.name, step.op_type)
        self.steps.append((check, (cond,), (), within))
        self.first_outputs.append(None)

    def folds(self, step: Step, ins: tuple[int, ...], produced: Sequence[Any]) -> bool:
        """Whether ``step``'s outputs are static values small enough to keep."""
        if step.subplans or step.op_type in NONDETERMINISTIC or not ins:
            return False
        if step.op_type in SHAPE_READERS:
            static = ins[0] in self.static_shape
        else:
            static = all(i in self.static_value for i in ins)
        return static and all(
            type(value) is np.ndarray and value.nbytes <= FOLD_BYTES for value in produced
        )

    def keeps_shape(self, step: Step, ins: tuple[int, ...]) -> bool:
        """Whether ``step``'s output shapes follow from the input shapes."""
        if step.subplans or not all(i in self.static_shape for i in ins):
            return False
        if step.op_type in SHAPE_FROM_SHAPES:
            return True
        by_value = SHAPE_FROM_VALUES.get(step.op_type)
        return by_value is not None and all(
            ins[i] in self.static_value for i in by_value if i < len(ins)
        )

    def tick(self, step: Step, produced: Sequence[Any]) -> None:
        """Observe a kept step."""
        now = perf_counter()
        if self.observe is not None:
            self.observe(step, produced, now - self.started)
        self.started = now


def specialize(
    plan: Plan,
    inputs: Sequence[Any],
    cancel: CancelToken,
    observe: Observer | None = None,
    *,
    speculate: bool = False,
) -> Specialization:
    """Run ``plan`` on ``inputs`` and return the plan specialised for their shapes (see
    the module), the outputs, and every kept step's first output. ``observe`` is called
    after each kept step. ``speculate``: an ``If`` on data is inlined too, the branch it
    takes now, behind a guard step that raises :class:`~.plan.BranchChanged` when a
    later run would take the other one.

    Raises:
        InferCancelledError: ``cancel.requested`` was set; checked before each kernel.
        InferenceError: a kernel raised; the message names the node.
    """
    builder = _Builder(plan, cancel, observe)
    builder.speculate = speculate
    where: dict[int, int] = {NONE_SLOT: NONE_SLOT, SCRATCH_SLOT: SCRATCH_SLOT}
    for slot, array in plan.constants:
        where[slot] = slot
        builder.values[slot] = array
        builder.static_value.add(slot)
        builder.static_shape.add(slot)
    for slot, value in zip(plan.input_slots, inputs):
        where[slot] = slot
        builder.values[slot] = value
        if type(value) is np.ndarray:
            builder.static_shape.add(slot)
    previous = swap_cancel_token(cancel)
    try:
        builder.walk(plan.steps, where, 0)
    finally:
        swap_cancel_token(previous)
    output_slots = tuple(where[s] for s in plan.output_slots)
    outputs = [builder.values[s] for s in output_slots]
    pinned = set(output_slots) | {s for s, _ in builder.constants} | {NONE_SLOT, SCRATCH_SLOT}
    free = releases([(ins, outs) for _, ins, outs, _ in builder.steps], pinned)
    steps = tuple(
        # The constructor, not dataclasses.replace: five times faster, on the first run
        # of every new input shapes.
        Step(
            s.kernel,
            ins,
            outs,
            release,
            s.name,
            s.op_type,
            s.execution_type,
            s.out_kernel,
            s.subplans,
            within,
        )
        for (s, ins, outs, within), release in zip(builder.steps, free)
    )
    specialized = Plan(
        num_slots=builder.next_slot,
        constants=tuple(builder.constants),
        input_slots=plan.input_slots,
        output_slots=output_slots,
        steps=steps,
        variables=plan.variables,
    )
    return Specialization(specialized, outputs, builder.first_outputs)


def _guard(taken: bool, name: str) -> Any:
    def guard(cond: Any) -> tuple[()]:
        if bool(np.asarray(cond).reshape(-1)[0]) != taken:
            raise BranchChanged(f"If {name!r} takes the other branch now")
        return ()

    return guard


def may_specialize(plan: Plan) -> bool:
    """Whether specialising ``plan`` can drop steps: it reads a shape or branches."""
    return any(s.op_type in SHAPE_READERS or s.op_type == "If" for s in plan.steps)


def specialized_run(plan: Plan, inputs: Sequence[Any], cancel: CancelToken) -> list[Any]:
    """Run a sub-plan (whose caller made ``cancel`` the thread's token) through its
    version specialised for the shapes of ``inputs``, made on the first run with them."""
    key = shapes_key(inputs)
    cache = plan.specialized
    found = cache.get(key)
    if found is not None:
        return found.run_steps(inputs, cancel)
    made = specialize(plan, inputs, cancel)
    if len(cache) >= MAX_SPECIALIZED:
        cache.clear()
    cache[key] = made.plan
    return made.outputs
