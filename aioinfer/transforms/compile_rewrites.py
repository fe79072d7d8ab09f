"""The rewrites of the model every compile gets, on every device: chosen by the Core
before the device compiles (the device sees the rewritten model and never ``LOGITS``).

- :class:`~aioinfer.transforms.grouped_attention.GroupedAttentionPass`, always: a
  grouped-query decoder as exported repeats its KV cache for the query heads at every
  step; grouped, the same products read the cache as it is (the same numbers, no
  copy). A model without such a repeat is not touched, nor copied.
- :class:`~aioinfer.transforms.last_position.LastPositionPass` when ``LOGITS`` is
  ``"LAST"``, the default for a decoder that ``STATEFUL`` makes stateful: generation
  reads the logits of the last position only, and a prefill that projects every
  position onto the vocabulary spends most of its time on positions nobody reads.
  ``"ALL"`` keeps the exported outputs (to score every position of a prompt).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aioinfer.model import Model
from aioinfer.properties import LOGITS, STATEFUL, declare, parse_config, property_name
from aioinfer.transforms.grouped_attention import GroupedAttentionPass
from aioinfer.transforms.last_position import LastPositionPass, slices_last_position
from aioinfer.transforms.make_stateful import stateful_pairs
from aioinfer.transforms.rewrite import is_op

LOGITS_OUTPUT = "logits"
"""The output ``LOGITS`` acts on: the exporters' name, the one generation reads."""

_DECLARED = declare(LOGITS, STATEFUL)


def compile_rewrites(model: Model, config: Mapping[str, Any]) -> tuple[Model, dict[str, Any]]:
    """``model`` as a device should compile it with ``config``, and ``config`` less
    ``LOGITS`` (see the module). ``model`` is not changed: a rewrite goes to a copy,
    which shares the weights.

    Raises:
        InvalidPropertyValueError: a bad ``LOGITS`` or ``STATEFUL``.
        InvalidModelError: ``LOGITS`` ``"LAST"`` given for a model whose ``logits`` are
            not made by a projection whose last position can be sliced (named).
    """
    rest = {property_name(name): value for name, value in config.items()}
    asked: dict[str, Any] = {name: rest[name] for name in ("LOGITS", "STATEFUL") if name in rest}
    parsed = parse_config(asked, _DECLARED)
    rest.pop("LOGITS", None)
    graph = model.ir.graph
    logits = parsed["LOGITS"] or ("LAST" if _generates(model, parsed["STATEFUL"]) else "ALL")
    repeats = any(is_op(node, "Expand") for node in graph)
    if logits == "ALL" and not repeats:
        return model, rest
    copy = model.ir.clone()
    grouped = GroupedAttentionPass()(copy).modified if repeats else False
    if logits == "LAST":
        LastPositionPass(LOGITS_OUTPUT)(copy)
    elif not grouped:
        return model, rest
    return Model(copy), rest


def _generates(model: Model, stateful: Any) -> bool:
    """Whether ``model`` is a decoder ``STATEFUL`` makes stateful (``stateful``: the
    parsed property) whose logits can be kept at the last position."""
    graph = model.ir.graph
    if not stateful or not slices_last_position(graph, LOGITS_OUTPUT):
        return False
    pairs = stateful_pairs(graph, stateful)
    return bool(pairs) and LOGITS_OUTPUT not in pairs.values()
