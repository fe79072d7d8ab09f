"""Make-stateful: chosen input/output pairs of a graph become internal variables.

ONNX has no state operator, so a model with a KV cache or an RNN state takes the old
state as an input and returns the new one as an output. Given pairs
``{input name: output name}`` (the ``STATEFUL`` config), this pass turns each pair into
a *variable*, named after the input, with two ops of the ``ai.aioinfer`` domain:

- ``ai.aioinfer::ReadValue(variable_id=name) -> value`` produces what the input gave:
  the variable's current value. The input leaves ``graph.inputs``.
- ``ai.aioinfer::Assign(value, variable_id=name)`` consumes what the output gave: the
  variable's value for the next step. The output leaves ``graph.outputs``.

A device lowers the two ops as inputs and outputs of its executable form (the CPU plan
fills ReadValue values from the request's variables before a run and reads Assign values
after it completed), so that each request keeps its own variables.

``"auto"`` pairs every input with the output that the first matching convention of
:data:`AUTO_CONVENTIONS` names (``*`` matches any text, the same text on both sides).

Assign nodes have no outputs: run this pass after unused-node removal.

A variable starts from zeros shaped like its input. A dimension that the input leaves
unnamed (``[2, ?, 128]``) has no size to start from; :class:`SizeStatesPass` runs first
and names it after what the graph tells: where the state reaches the ``initial_h`` /
``initial_c`` of an ``RNN``, ``GRU`` or ``LSTM`` at the batch axis, the dimension is the
batch of that node's ``X`` (a static size, the name of an input's dimension, or
:func:`aioinfer.model.unnamed_dim_name` of it). Where the graph does not tell, a state
with one unknown dimension left takes the batch of the regular inputs, when they have
one: every input whose first dimension is not static leads with the same dimension
(silero VAD: ``state [2, ?, 128]`` beside ``input [?, samples]``, sized as the
``[2, batch, 128]`` zeros its users feed). Two unknown dimensions, inputs that lead
with different ones, or a state the graph ties to a batch it cannot size (an RNN's
initial state whose ``X`` comes out of a run-time ``Reshape``: its batch is ``X``'s
second axis, not the inputs' first) stay unknown: the state must be set before the
first step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from aioinfer.errors import InvalidPropertyValueError
from aioinfer.model import Dim, unnamed_dim_name
from aioinfer.transforms.rewrite import rank

STATE_DOMAIN = "ai.aioinfer"
"""The domain of aioinfer's own ops."""
READ_VALUE = "ReadValue"
ASSIGN = "Assign"

AUTO_CONVENTIONS: tuple[tuple[str, str], ...] = (
    ("past_key_values.*", "present.*"),  # Hugging Face Optimum, onnxruntime-genai
    ("*past*", "*present*"),  # past_0 -> present_0, past_key_values.0 -> present_key_values.0
    ("*h0", "*hn"),  # PyTorch RNN naming: h0 -> hn, lstm.h0 -> lstm.hn
    ("*c0", "*cn"),
    ("*h", "*hn"),  # silero VAD up to v4: h -> hn, c -> cn
    ("*c", "*cn"),
    ("*state", "*stateN"),  # silero VAD v5: state -> stateN
    ("*state_in*", "*state_out*"),  # state_in -> state_out, rnn_state_in_1 -> ..._out_1
    ("*_in", "*_out"),  # h_in -> h_out, cache_in -> cache_out
    ("*state", "*state_out"),  # state -> state_out, lstm_state -> lstm_state_out
    ("*hidden", "*hidden_out"),  # hidden -> hidden_out
    ("*", "new_*"),  # icefall / sherpa-onnx: cached_len_0 -> new_cached_len_0
)
"""``(input pattern, output pattern)`` pairs that ``"auto"`` tries, in this order."""


def _feeds(graph: ir.Graph) -> dict[str, ir.Value]:
    return {v.name: v for v in graph.inputs if v.name and v.name not in graph.initializers}


def _outputs(graph: ir.Graph) -> dict[str, ir.Value]:
    return {v.name: v for v in graph.outputs if v.name}


def _auto_pairs(inputs: Mapping[str, ir.Value], outputs: Mapping[str, ir.Value]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for input_name in inputs:
        for input_pattern, output_pattern in AUTO_CONVENTIONS:
            regex = "(.*)".join(re.escape(part) for part in input_pattern.split("*"))
            match = re.fullmatch(regex, input_name)
            if match is None:
                continue
            pieces = output_pattern.split("*")
            output_name = pieces[0] + "".join(
                group + piece for group, piece in zip(match.groups(), pieces[1:])
            )
            if output_name in outputs and output_name not in pairs.values():
                pairs[input_name] = output_name
                break
    return pairs


def _names(values: Mapping[str, ir.Value]) -> str:
    return ", ".join(repr(n) for n in values) or "none"


def _check_pair(input_value: ir.Value, output_value: ir.Value) -> str | None:
    """Why the pair cannot be a variable, or None."""
    if not isinstance(input_value.type, ir.TensorType) or not isinstance(
        output_value.type, ir.TensorType
    ):
        return "a variable holds a tensor, and this pair is not a pair of tensors"
    if input_value.dtype != output_value.dtype:
        return (
            f"the element types differ (input {_type_name(input_value)}, "
            f"output {_type_name(output_value)})"
        )
    input_rank, output_rank = rank(input_value), rank(output_value)
    if input_rank is None:
        return "the input has no known rank; a variable needs one for its initial value"
    if output_rank is not None and output_rank != input_rank:
        return f"the ranks differ (input rank {input_rank}, output rank {output_rank})"
    return None


def _type_name(value: ir.Value) -> str:
    return "unknown" if value.dtype is None else value.dtype.name.lower()


def stateful_pairs(graph: ir.Graph, config: str | Mapping[str, str] | None) -> dict[str, str]:
    """The validated pairs ``{input name: output name}`` that ``config`` asks for.

    ``config`` is the parsed ``STATEFUL`` property: ``"AUTO"``, a mapping, or None (no
    state). The pairs come back in the order of the graph's inputs.

    Raises:
        InvalidPropertyValueError: a name the graph does not have (the message lists the
            real ones); a pair whose element types or ranks differ (the message names the
            pair); ``"AUTO"`` on a graph where no convention matches.
    """
    inputs, outputs = _feeds(graph), _outputs(graph)
    if config is None:
        return {}
    if isinstance(config, str):
        pairs = _auto_pairs(inputs, outputs)
        if not pairs:
            conventions = ", ".join(f"{i} -> {o}" for i, o in AUTO_CONVENTIONS)
            raise InvalidPropertyValueError(
                f"STATEFUL is 'auto' but no input/output pair of the model follows a known "
                f"convention ({conventions}); its inputs are {_names(inputs)}, its outputs "
                f"are {_names(outputs)}: give the pairs as {{input name: output name}}"
            )
    else:
        pairs = dict(config)
    for input_name, output_name in pairs.items():
        if input_name not in inputs:
            raise InvalidPropertyValueError(
                f"STATEFUL pair {input_name!r} -> {output_name!r}: the model has no input "
                f"named {input_name!r}; its inputs are {_names(inputs)}"
            )
        if output_name not in outputs:
            raise InvalidPropertyValueError(
                f"STATEFUL pair {input_name!r} -> {output_name!r}: the model has no output "
                f"named {output_name!r}; its outputs are {_names(outputs)}"
            )
        problem = _check_pair(inputs[input_name], outputs[output_name])
        if problem is not None:
            raise InvalidPropertyValueError(
                f"STATEFUL pair {input_name!r} -> {output_name!r}: {problem}"
            )
    return {name: pairs[name] for name in inputs if name in pairs}


class MakeStatefulPass(ir.passes.InPlacePass):
    """Turn each ``{input name: output name}`` pair into a ReadValue/Assign variable.

    The pairs must have been validated by :func:`stateful_pairs`.
    """

    def __init__(self, pairs: Mapping[str, str]) -> None:
        super().__init__()
        self.pairs = dict(pairs)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.pairs:
            return ir.passes.PassResult(model, modified=False)
        graph = model.graph
        inputs, outputs = _feeds(graph), _outputs(graph)
        first = next(iter(graph), None)
        for input_name, output_name in self.pairs.items():
            past, present = inputs[input_name], outputs[output_name]
            graph.inputs.remove(past)
            variable = ir.AttrString("variable_id", input_name)
            # The input's value becomes the ReadValue's output: every use stays in place.
            read = ir.Node(
                STATE_DOMAIN, READ_VALUE, [], [variable], outputs=[past], name=f"{input_name}/read"
            )
            if first is None:
                graph.append(read)
            else:
                graph.insert_before(first, read)
            graph.outputs.remove(present)
            graph.append(
                ir.Node(
                    STATE_DOMAIN,
                    ASSIGN,
                    [present],
                    [variable],
                    num_outputs=0,
                    name=f"{input_name}/assign",
                )
            )
        model.opset_imports.setdefault(STATE_DOMAIN, 1)
        return ir.passes.PassResult(model, modified=True)


RECURRENT_OPS = ("RNN", "GRU", "LSTM")
_STATE_INPUTS = (5, 6)  # initial_h, initial_c


def _dims(value: ir.Value | None) -> list[Dim] | None:
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else d.value for d in value.shape]


def _batch_dims(model: ir.Model) -> list[tuple[Dim, Dim]]:
    """For each RNN/GRU/LSTM state input: (its batch dimension, the batch of ``X``)."""
    found = []
    for graph in model.graphs():
        for node in graph:
            if node.domain not in ("", "ai.onnx") or node.op_type not in RECURRENT_OPS:
                continue
            axis = 0 if node.attributes.get_int("layout", 0) else 1
            x = _dims(node.inputs[0])
            if x is None or len(x) != 3:
                continue
            for index in _STATE_INPUTS:
                state = _dims(node.inputs[index]) if index < len(node.inputs) else None
                if state is not None and len(state) == 3:
                    found.append((state[axis], x[axis]))
    return found


_LOCAL_CONSTANT_SIZE = 1024


def _local_constants(model: ir.Model) -> None:
    """Give each subgraph a ``Constant`` of its own for every small initializer of an
    outer graph it reads: ONNX shape inference reads constant inputs (``Unsqueeze``
    axes, ``Gather`` indices) only in their own graph, and speech models keep their
    network in the branches of an ``If`` on the sample rate."""
    for graph in model.graph.subgraphs():
        for node in list(graph):
            for index, value in enumerate(node.inputs):
                tensor = None if value is None else value.const_value
                if value is None or tensor is None or value.graph is graph:
                    continue
                if not value.is_initializer() or tensor.size > _LOCAL_CONSTANT_SIZE:
                    continue
                constant = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)])
                graph.insert_before(node, constant)
                node.replace_input_with(index, constant.outputs[0])


def state_shapes(model: ir.Model, states: list[str]) -> dict[str, list[Dim]]:
    """The shapes that the inputs ``states`` take as variables, where the graph tells a
    size for a dimension the input leaves unknown (see the module's docstring).

    Shape inference runs on a copy of ``model`` in which every unknown dimension of a
    graph input has a name of its own, so that the names show where they go.
    """
    feeds = _feeds(model.graph)
    shapes = {name: _dims(feeds[name]) for name in states}
    unsized = {name: dims for name, dims in shapes.items() if dims is not None and None in dims}
    if not unsized:
        return {}
    copy = model.clone()
    owners: dict[str, tuple[str, int]] = {}
    for value in _feeds(copy.graph).values():
        dims = _dims(value)
        if dims is None or None not in dims:
            continue
        for axis, dim in enumerate(dims):
            if dim is None:
                name = unnamed_dim_name(value.name or "", axis)
                owners[name] = (value.name or "", axis)
                dims[axis] = name
        value.shape = ir.Shape(dims)
    _local_constants(copy)
    ShapeInferencePass(check_type=False, strict_mode=False)(copy)
    # A size the inputs give: a name of a regular input's dimension, named or not (shape
    # inference also makes up names, "unk__0", that no input gives).
    given = {
        d for n, v in feeds.items() if n not in shapes for d in _dims(v) or [] if isinstance(d, str)
    }
    given |= {name for name, (owner, _) in owners.items() if owner not in shapes}
    sized: dict[str, list[Dim]] = {}
    tied: set[str] = set()  # states the graph ties to a batch, sized by it or not at all
    for state_dim, batch in _batch_dims(copy):
        owner = owners.get(state_dim) if isinstance(state_dim, str) else None
        if owner is None or owner[0] not in unsized:
            continue
        tied.add(owner[0])
        if isinstance(batch, int) or batch in given:
            sized.setdefault(owner[0], unsized[owner[0]])[owner[1]] = batch
    batch = _leading_batch(feeds, shapes)
    for name, dims in unsized.items():
        if batch is not None and name not in tied and dims.count(None) == 1:
            dims[dims.index(None)] = batch
            sized[name] = dims
    return sized


def _leading_batch(feeds: Mapping[str, ir.Value], states: Mapping[str, object]) -> Dim:
    """The batch of the regular inputs: the one dimension that leads every input whose
    first dimension is not static (its name, or :func:`aioinfer.model.unnamed_dim_name`
    of it); None when no input has one, or when they name different ones."""
    leading = set()
    for name, value in feeds.items():
        dims = _dims(value)
        if name in states or not dims or isinstance(dims[0], int):
            continue
        leading.add(dims[0] if isinstance(dims[0], str) else unnamed_dim_name(name, 0))
    return leading.pop() if len(leading) == 1 else None


class SizeStatesPass(ir.passes.InPlacePass):
    """Give the inputs that will become variables the shapes :func:`state_shapes` finds
    (their unknown dimensions named or sized as the graph tells); run it before shape
    inference and make-stateful."""

    def __init__(self, pairs: Mapping[str, str]) -> None:
        super().__init__()
        self.pairs = dict(pairs)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        shapes = state_shapes(model, list(self.pairs))
        feeds = _feeds(model.graph)
        for name, dims in shapes.items():
            feeds[name].shape = ir.Shape(dims)
        return ir.passes.PassResult(model, modified=bool(shapes))


def variable_shapes(graph: ir.Graph) -> dict[str, tuple[Dim, ...]]:
    """The shape of each variable's value as the graph has it (``ReadValue``'s output):
    the input's declared shape, with the dimensions :class:`SizeStatesPass` sized."""
    shapes = {}
    for node in graph:
        if node.domain == STATE_DOMAIN and node.op_type == READ_VALUE:
            dims = _dims(node.outputs[0])
            if dims is not None:
                shapes[node.attributes["variable_id"].as_string()] = tuple(dims)
    return shapes
