"""What a device implements to run an ``AsyncInferQueue`` itself: the engine protocol
that ``CompiledModel.create_queue_engine`` returns, and the error bookkeeping every
engine shares with the generic queue (:mod:`aioinfer.queue`, which uses both)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from aioinfer.errors import RequestClosedError

if TYPE_CHECKING:
    from aioinfer.model import Inputs


class QueueEngine(Protocol):
    """What runs an ``AsyncInferQueue`` on a device that keeps its jobs itself (see
    ``CompiledModel.create_queue_engine``): the queue's methods, with its semantics (the
    conformance suite's queue tests hold for it), ``len()`` and ``engine[id]`` for the
    requests, and ``userdata``."""

    userdata: list[Any]

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Any: ...
    def set_callback(self, callback: Callable[[Any, Any], Any] | None) -> None: ...
    def is_ready(self) -> bool: ...
    async def get_idle_request_id(self) -> int: ...
    async def start_async(
        self, inputs: Inputs | None, userdata: Any, *, share_inputs: bool = False
    ) -> None: ...
    async def wait_all(self) -> None: ...
    async def close(self) -> None: ...


class QueueErrors:
    """Whether a queue is closed, and the job errors it has not raised yet: the generic
    queue's and a device's queue engine's alike."""

    _closed: bool
    _errors: list[BaseException]

    def _check_open(self) -> None:
        if self._closed:
            raise RequestClosedError("this AsyncInferQueue is closed")

    def _raise_pending(self) -> None:
        """Raise the first job error not raised yet (and forget the others)."""
        self._check_open()
        if self._errors:
            error = self._errors.pop(0)
            self._errors.clear()
            raise error
