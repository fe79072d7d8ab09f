"""Token generation from a decoder whose KV cache is the request's variable state.

``aioinfer.generate(compiled, input_ids)`` is an async generator of token ids. Compiled
with ``STATEFUL`` (``"auto"`` pairs ``past_*`` inputs with ``present_*`` outputs), the
decoder keeps its cache in the infer request, so each step after the prompt feeds one
token per sequence. Concurrent generations on one compiled model run together: one
scheduler per compiled decoder advances every running sequence in one batched inference
per step, admitting and retiring sequences between steps (:mod:`.scheduler`, with the
cache layout of :mod:`.cache` and the per-sequence choice of :mod:`.sampling`).
``generate(..., request=...)`` runs one generation alone on the caller's request
(:mod:`.single`). Compiling applies two rewrites by default (see
:mod:`aioinfer.transforms.compile_rewrites`), also given here as functions:
:func:`last_position_logits` (``LOGITS`` ``"LAST"``, the default with ``STATEFUL``), so
that a prefill computes the logits of each sequence's last position only (what
generation reads), and :func:`grouped_query_attention` (always), so that grouped-query
attention does not repeat the cache at every step.
"""

from aioinfer.generation.api import generate, generate_steps, prompt_ids
from aioinfer.generation.config import GenerationConfig
from aioinfer.generation.sampling import FINISH_LENGTH, FINISH_STOP, Picker, Sampling, Step
from aioinfer.generation.scheduler import (
    GenerationScheduler,
    GenerationStatistics,
    SchedulerCounts,
    scheduler_of,
    schedulers_of,
)
from aioinfer.transforms.grouped_attention import grouped_query_attention
from aioinfer.transforms.last_position import last_position_logits

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "GenerationConfig",
    "GenerationScheduler",
    "GenerationStatistics",
    "Picker",
    "Sampling",
    "SchedulerCounts",
    "Step",
    "generate",
    "generate_steps",
    "grouped_query_attention",
    "last_position_logits",
    "prompt_ids",
    "scheduler_of",
    "schedulers_of",
]
