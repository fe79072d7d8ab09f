"""Text model folders as users download them, recognized by their files.

- **sentence-transformers** (a ``modules.json``): the ONNX model at ``onnx/model.onnx``
  (sentence-transformers' ONNX backend) or ``model.onnx``; the pooling of its
  ``Pooling`` module's ``config.json`` (``pooling_mode``, or the older
  ``pooling_mode_*_tokens`` flags); normalization when it lists a ``Normalize`` module;
  the maximum length of ``sentence_bert_config.json``'s ``max_seq_length`` (older
  folders) or of the tokenizer's ``model_max_length`` (newer ones); prompts from
  ``config_sentence_transformers.json``.
- **optimum text-classification** (``model.onnx`` and a ``config.json`` whose
  architecture is ``...ForSequenceClassification``): a cross-encoder, for reranking.
- **optimum feature-extraction** (``model.onnx`` and any other ``config.json``): token
  vectors, mean-pooled and not normalized (optimum writes no pooling config; mean
  pooling is what most embedding models use).

Either way the maximum length is capped at the model's ``max_position_embeddings``, as
sentence-transformers does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioinfer.errors import ModelFolderError
from aioinfer.pipelines.pooling import LEGACY_KEYS, POOLING
from aioinfer.text.tokenizer import read_json_object

SENTENCE_TRANSFORMERS = "sentence-transformers"
FEATURE_EXTRACTION = "feature-extraction"
TEXT_CLASSIFICATION = "text-classification"
_ONNX_PLACES = ("onnx/model.onnx", "model.onnx")
_SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class TextModelFolder:
    """What a text pipeline reads from a model folder.

    Attributes:
        path: the folder.
        layout: ``"sentence-transformers"``, ``"feature-extraction"`` or
            ``"text-classification"``.
        onnx: the ONNX model file.
        tokenizer: the folder holding ``tokenizer.json``.
        pooling: the pooling modes (names of sentence-transformers' ``pooling_mode``).
        normalize: whether vectors are L2-normalized by default.
        max_length: the most tokens per text (None: the tokenizer's own).
        prompts: named prompts prepended to texts; ``default_prompt_name`` names the one
            used when a call names none.
        num_labels: the classifier's labels (text-classification).
        activation: the score of a one-label classifier: ``"sigmoid"`` or ``"identity"``.
    """

    path: Path
    layout: str
    onnx: Path
    tokenizer: Path
    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    num_labels: int = 0
    activation: str = "identity"


def _onnx_file(folder: Path) -> Path:
    for place in _ONNX_PLACES:
        if (folder / place).is_file():
            return folder / place
    raise ModelFolderError(
        f"{folder}: expected an ONNX model at {' or '.join(_ONNX_PLACES)}, found none"
    )


def _module_kind(module: dict[str, Any]) -> str:
    """``"Pooling"`` for ``sentence_transformers.models.Pooling`` and for the newer
    ``sentence_transformers.sentence_transformer.modules.pooling.Pooling``."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _pooling_modes(path: Path) -> tuple[str, ...]:
    config = read_json_object(path)
    mode = config.get("pooling_mode")
    if mode is not None:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(name for key, name in LEGACY_KEYS.items() if config.get(key))
    unknown = [m for m in modes if m not in POOLING]
    if not modes or unknown:
        raise ModelFolderError(
            f"{path}: expected pooling modes among {sorted(POOLING)}, got {list(modes)}"
        )
    if config.get("include_prompt", True) is False:
        raise ModelFolderError(f"{path}: pooling that excludes the prompt is not supported")
    return modes


def _position_limit(folder: Path, max_length: int | None) -> int | None:
    positions = read_json_object(folder / "config.json").get("max_position_embeddings")
    if isinstance(max_length, int) and isinstance(positions, int) and positions > 0:
        return min(max_length, positions)
    return max_length


def _tokenizer_max_length(folder: Path) -> int | None:
    value = read_json_object(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(value, (int, float)) and 0 < value < 10**12:
        return int(value)
    return None


def _sentence_transformers(folder: Path) -> TextModelFolder:
    modules = _read_json_list(folder / "modules.json")
    kinds = [_module_kind(module) for module in modules]
    unsupported = [kind for kind in kinds if kind not in _SUPPORTED_MODULES]
    if unsupported or "Transformer" not in kinds:
        raise ModelFolderError(
            f"{folder / 'modules.json'}: expected the modules {list(_SUPPORTED_MODULES)} "
            f"(a Transformer first), got {kinds}"
        )
    by_kind = {kind: folder / str(module.get("path", "")) for kind, module in zip(kinds, modules)}
    pooling: tuple[str, ...] = ("mean",)
    if "Pooling" in by_kind:
        pooling = _pooling_modes(by_kind["Pooling"] / "config.json")
    transformer = by_kind["Transformer"]
    max_length = read_json_object(transformer / "sentence_bert_config.json").get("max_seq_length")
    if not isinstance(max_length, int):
        max_length = _tokenizer_max_length(transformer)
    settings = read_json_object(folder / "config_sentence_transformers.json")
    prompts = settings.get("prompts") or {}
    return TextModelFolder(
        path=folder,
        layout=SENTENCE_TRANSFORMERS,
        onnx=_onnx_file(transformer),
        tokenizer=transformer,
        pooling=pooling,
        normalize="Normalize" in by_kind,
        max_length=_position_limit(transformer, max_length),
        prompts={str(k): str(v) for k, v in prompts.items()},
        default_prompt_name=settings.get("default_prompt_name"),
    )


def _read_json_list(path: Path) -> list[dict[str, Any]]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ModelFolderError(f"{path}: expected a list of modules, got {value!r:.80}")
    return value


def _activation(config: dict[str, Any], num_labels: int) -> str:
    """sentence-transformers' CrossEncoder default: the sigmoid of a single logit, unless
    the folder names its activation."""
    named = (config.get("sentence_transformers") or {}).get("activation_fn")
    if isinstance(named, str):
        if named.endswith("Sigmoid"):
            return "sigmoid"
        if named.endswith("Identity"):
            return "identity"
        raise ModelFolderError(f"activation_fn: expected Sigmoid or Identity, got {named!r}")
    return "sigmoid" if num_labels == 1 else "identity"


def read_folder(folder: str | Path) -> TextModelFolder:
    """What ``folder`` holds, recognized by its files (see the module's docstring).

    Raises:
        ModelFolderError: no ONNX model, a layout or module not supported, a malformed
            config file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"{folder}: expected a model folder, found no directory")
    if (folder / "modules.json").is_file():
        return _sentence_transformers(folder)
    onnx = _onnx_file(folder)
    config = read_json_object(folder / "config.json")
    architectures = [str(a) for a in config.get("architectures") or []]
    max_length = _position_limit(folder, _tokenizer_max_length(folder))
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        labels = config.get("id2label")
        num_labels = len(labels) if isinstance(labels, dict) else int(config.get("num_labels", 2))
        return TextModelFolder(
            path=folder,
            layout=TEXT_CLASSIFICATION,
            onnx=onnx,
            tokenizer=folder,
            max_length=max_length,
            num_labels=num_labels,
            activation=_activation(config, num_labels),
        )
    return TextModelFolder(
        path=folder, layout=FEATURE_EXTRACTION, onnx=onnx, tokenizer=folder, max_length=max_length
    )
