"""Generation over KServe v2 gRPC, as Triton's decoupled models answer a stream.

A request to a model whose config has ``generate`` asks for a generation when it gives
one input, the prompt: the config's ``input_ids`` (INT64 or INT32, ``[n]`` or ``[1, n]``)
or ``text_input`` (BYTES, one element; with a ``tokenizer.json``), outside a sequence,
and names none of the model's own outputs. Its parameters are those of
:data:`~aioinfer.serving.generation.PARAMETERS` (``stop``: a token id, or a JSON list of
them in a string: gRPC parameters hold no lists). Any other request to the model is an
ordinary inference (a sequence's step, the logits of a prompt).

On ``ModelStreamInfer`` each token is one response, as it comes: ``token_id`` and
``index`` (INT64 ``[1]``), and ``text_output`` (BYTES ``[1]``, the text the token adds)
with a tokenizer. Every response carries the parameter ``triton_final_response``, true on
the last one, which also carries ``finish_reason``; a client that set
``triton_enable_empty_final_response`` (tritonclient's ``enable_empty_final_response``)
gets the tokens all non-final and then an empty final response. An error before the
first token or after it is one ``error_message`` response, the last for the request. On
``ModelInfer`` the generation is one response: ``output_ids`` (INT64 ``[n]``),
``text_output``, and ``finish_reason``, as REST's ``/generate``.

A step runs only when the adapter asks for the next token, so a call that is cancelled
(the client cancelled it or closed the stream) stops the generation at that step.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from aioinfer.errors import ProtocolError, ServiceError
from aioinfer.serving.generation import GeneratedToken, GenerateRequest, ModelGeneration
from aioinfer.serving.grpc.tensors import decode_infer_request, encode_infer_response
from aioinfer.serving.json_values import object_array
from aioinfer.serving.messages import InferenceResponse
from aioinfer.serving.service import InferenceService

TEXT_INPUT = "text_input"
STREAM_OUTPUTS = ("token_id", "index", "text_output")
"""The outputs of each streamed token (``text_output`` with a tokenizer only)."""
UNARY_OUTPUTS = ("output_ids", "text_output")
"""The outputs of a whole generation answered by ``ModelInfer``."""
FINAL_RESPONSE = "triton_final_response"
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
TRANSPORT_PARAMETERS = (
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    EMPTY_FINAL_RESPONSE,
)
"""Request parameters that tritonclient may send and that are not the generation's."""

_StreamResponse = service_pb2.ModelStreamInferResponse
_InferResponse = service_pb2.ModelInferResponse
_PROMPT_DATATYPES = ("INT64", "INT32")


def generation_of(service: InferenceService, message: Any) -> ModelGeneration | None:
    """The generation ``message`` (a ``ModelInferRequest``) asks for; None for an
    ordinary inference (or a model that cannot be found: the inference says so)."""
    if not service.generations or not message.inputs:
        return None
    try:
        model = service.find(message.model_name, message.model_version or None)
    except ServiceError:
        return None
    generation = service.generations.get(model)
    if generation is None:
        return None
    prompts = {generation.config.input_ids, TEXT_INPUT}
    if any(tensor.name not in prompts for tensor in message.inputs):
        return None
    sequence = message.parameters.get("sequence_id")
    if sequence is not None and (sequence.int64_param or sequence.string_param):
        return None
    own = model.output_names
    if any(output.name in own for output in message.outputs):
        return None
    return generation


def decode_generate_request(message: Any, generation: ModelGeneration) -> GenerateRequest:
    """The generate request of ``message``, a request that :func:`generation_of` found
    to ask for ``generation``.

    Raises:
        ProtocolError: a prompt of the wrong datatype or count, tensors that disagree
            with their shape (the messages of :mod:`~aioinfer.serving.grpc.tensors`),
            text that is not UTF-8.
    """
    datatypes = {}
    for tensor in message.inputs:
        allowed = ("BYTES",) if tensor.name == TEXT_INPUT else _PROMPT_DATATYPES
        if tensor.datatype not in allowed:
            raise ProtocolError(
                f"input {tensor.name!r}: datatype {tensor.datatype!r} given, a generation "
                f"takes {' or '.join(allowed)}"
            )
        datatypes[tensor.name] = tensor.datatype
    decoded = decode_infer_request(message, datatypes)
    input_ids: Sequence[int] | None = None
    text: str | None = None
    for name, array in decoded.inputs.items():
        if name == TEXT_INPUT:
            text = _text(array)
        else:
            input_ids = array.tolist() if array.ndim else [array.item()]
    parameters = {
        key: value for key, value in decoded.parameters.items() if key not in TRANSPORT_PARAMETERS
    }
    if isinstance(parameters.get("stop"), str):
        parameters["stop"] = _json_or_text(parameters["stop"])
    return GenerateRequest(input_ids, text, parameters)


async def stream_generation(
    service: InferenceService, message: Any, generation: ModelGeneration
) -> AsyncIterator[Any]:
    """The ``ModelStreamInferResponse`` of each token of the generation ``message``
    asks for; an error as the last response."""
    try:
        request = decode_generate_request(message, generation)
        wanted = _wanted(message, STREAM_OUTPUTS)
    except ServiceError as exc:
        yield stream_error(message, exc)
        return
    empty_final = _flag(message, EMPTY_FINAL_RESPONSE)
    tokens = service.generate(message.model_name, message.model_version or None, request)
    last: GeneratedToken | None = None
    async with aclosing(tokens):
        try:
            async for last in tokens:
                final = last.finish_reason is not None and not empty_final
                outputs = [
                    ("token_id", np.array([last.token_id], np.int64)),
                    ("index", np.array([last.index], np.int64)),
                ]
                if last.text is not None:
                    outputs.append(("text_output", object_array([last.text.encode()])))
                response = _response(message, last, outputs, wanted)
                _finish(response, last.finish_reason if final else None, final)
                yield _StreamResponse(infer_response=response)
        except ServiceError as exc:
            yield stream_error(message, exc)
            return
    if empty_final and last is not None:
        response = _header(message, last.model_name, last.model_version)
        _finish(response, last.finish_reason, True)
        yield _StreamResponse(infer_response=response)


async def generate_response(
    service: InferenceService, message: Any, generation: ModelGeneration
) -> Any:
    """The ``ModelInferResponse`` of the whole generation ``message`` asks for.

    Raises:
        ServiceError: a malformed request (see :func:`decode_generate_request`) or the
            errors of :meth:`InferenceService.generate
            <aioinfer.serving.service.InferenceService.generate>`.
    """
    request = decode_generate_request(message, generation)
    wanted = _wanted(message, UNARY_OUTPUTS)
    tokens = service.generate(message.model_name, message.model_version or None, request)
    async with aclosing(tokens):
        generated = [token async for token in tokens]
    last = generated[-1]
    outputs = [("output_ids", np.array([t.token_id for t in generated], np.int64))]
    if last.text is not None:
        text = "".join(t.text or "" for t in generated)
        outputs.append(("text_output", object_array([text.encode()])))
    response = _response(message, last, outputs, wanted)
    _finish(response, last.finish_reason, None)
    return response


def stream_error(message: Any, error: ServiceError) -> Any:
    """The stream's answer to ``message`` when ``error`` ended it: its
    ``error_message``, with the request's model and id, final."""
    header = _header(message, message.model_name, message.model_version)
    header.parameters[FINAL_RESPONSE].bool_param = True
    return _StreamResponse(error_message=str(error), infer_response=header)


def _response(
    message: Any,
    token: GeneratedToken,
    outputs: list[tuple[str, np.ndarray]],
    wanted: Sequence[str] | None,
) -> Any:
    if wanted is not None:
        arrays = dict(outputs)
        outputs = [(name, arrays[name]) for name in wanted if name in arrays]
    return encode_infer_response(
        InferenceResponse(
            token.model_name,
            token.model_version,
            message.id,
            [(name, array, True) for name, array in outputs],
        )
    )


def _header(message: Any, model_name: str, model_version: str) -> Any:
    return _InferResponse(model_name=model_name, model_version=model_version, id=message.id)


def _finish(response: Any, finish_reason: str | None, final: bool | None) -> None:
    """Mark ``response``: final or not (None: no flag, a unary answer), and why the
    generation ended."""
    if final is not None:
        response.parameters[FINAL_RESPONSE].bool_param = final
    if finish_reason is not None:
        response.parameters["finish_reason"].string_param = finish_reason


def _wanted(message: Any, known: Sequence[str]) -> list[str] | None:
    """The outputs ``message`` names (None: all).

    Raises:
        ProtocolError: one that a generation does not answer.
    """
    if not message.outputs:
        return None
    names = [output.name for output in message.outputs]
    for name in names:
        if name not in known:
            raise ProtocolError(
                f"a generation has no output named {name!r}; its outputs are "
                f"{', '.join(map(repr, known))}"
            )
    return names


def _flag(message: Any, name: str) -> bool:
    parameter = message.parameters.get(name)
    return parameter is not None and parameter.bool_param


def _text(array: np.ndarray) -> str:
    if array.size != 1:
        raise ProtocolError(
            f"input {TEXT_INPUT!r}: expected one BYTES element, got shape {list(array.shape)}"
        )
    raw = array.reshape(-1)[0]
    try:
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"input {TEXT_INPUT!r} is not UTF-8 text: {exc}") from None


def _json_or_text(value: str) -> Any:
    """``value`` read as JSON (``"[5, 7]"``, ``"5"``); as it is when it is not JSON (then
    refused by the generation, named)."""
    try:
        return json.loads(value)
    except ValueError:
        return value
