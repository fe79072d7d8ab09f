"""Model control: which models a service loads at the start, and whether clients may load
and unload models at run time (Triton's ``--model-control-mode``).

``none`` (the default): every model of the repository is loaded at the start and stays;
load and unload requests are refused with Triton's words. ``explicit``: only the models
named with ``--load-model`` (``*``: all) are loaded at the start; clients load, reload
(with a config override) and unload models at run time through the repository
extension. :class:`~aioinfer.serving.service.InferenceService` does the loading; this
module holds the mode and the checks.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

from aioinfer.errors import ErrorKind, ModelControlError, ServingConfigError
from aioinfer.serving.repository import ModelRepository

NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
"""Triton's answer to a load or unload outside ``explicit`` mode (clients match its
first words)."""


class ModelControlMode(enum.Enum):
    """Whether models are loaded and unloaded at run time."""

    NONE = "none"
    EXPLICIT = "explicit"

    @classmethod
    def parse(cls, value: str) -> ModelControlMode:
        """The mode named ``value`` (any case).

        Raises:
            ServingConfigError: not ``none`` or ``explicit``.
        """
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ServingConfigError(
                f"model control mode {value!r} is not supported; expected 'none' or 'explicit'"
            ) from None

    def check_allowed(self) -> None:
        """Refuse a load or unload unless the mode is ``explicit``.

        Raises:
            ModelControlError: UNAVAILABLE (Triton's code and words), in ``none`` mode.
        """
        if self is not ModelControlMode.EXPLICIT:
            raise ModelControlError(
                f"{NOT_ALLOWED} (the model control mode is 'none': start the server with "
                "--model-control-mode explicit to load and unload models)",
                ErrorKind.UNAVAILABLE,
            )


def check_no_model_files(name: str, parameters: Iterable[str]) -> None:
    """Refuse a load request whose parameters carry model files (Triton's ``file:``
    parameters, tritonclient's ``load_model(files=...)``): models come from the
    repository only.

    Raises:
        ModelControlError: INVALID_ARGUMENT, a ``file:`` parameter among ``parameters``.
    """
    if any(key.startswith("file:") for key in parameters):
        raise ModelControlError(
            f"failed to load {name!r}: model files in the request are not supported; "
            "put the model in the repository"
        )


def startup_models(
    mode: ModelControlMode, names: Sequence[str], repository: ModelRepository
) -> frozenset[str]:
    """The models to load at the start: every model in ``none`` mode; ``names`` in
    ``explicit`` mode (``"*"``: every model).

    Raises:
        ServingConfigError: ``names`` given in ``none`` mode, or naming a model that the
            repository does not have.
    """
    names = list(names)
    if mode is ModelControlMode.NONE:
        if names:
            raise ServingConfigError(
                "load_models (--load-model) needs model_control_mode 'explicit'; in 'none' "
                "mode every model is loaded"
            )
        return frozenset(repository.models)
    if "*" in names:
        return frozenset(repository.models)
    unknown = sorted(set(names) - set(repository.models))
    if unknown:
        known = ", ".join(map(repr, sorted(repository.models)))
        raise ServingConfigError(
            f"load_models names {unknown}, not in the repository; its models: {known}"
        )
    return frozenset(names)
