"""One generation on one infer request: the path of ``generate(..., request=...)`` and of
decoders the scheduler cannot batch (no ``attention_mask``, no KV cache in the request).

Nothing computes between steps: a step runs when the consumer asks for the next token, so
closing the generator stops the generation at once, and cancelling the consumer during a
step cancels that step between kernels; either way the request stays idle and usable.
Without a request of the caller's, each generation takes one from a pool per compiled
model of at most ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` requests: more concurrent
generations wait, in arrival order, for one to finish.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import AsyncGenerator

import anyio
import numpy as np

from aioinfer.generation.config import GenerationConfig
from aioinfer.generation.sampling import Sampling, Step, last_logits
from aioinfer.plugin.async_request import AsyncInferRequest, RequestState
from aioinfer.plugin.compiled_model import CompiledModel


async def generate_alone(
    compiled: CompiledModel,
    config: GenerationConfig,
    sampling: Sampling,
    prompt: list[int],
    request: AsyncInferRequest | None,
) -> AsyncGenerator[Step, None]:
    """The tokens of one generation of ``prompt`` on ``request`` (None: one of the
    compiled model's generation pool), its state reset first; see the module."""
    pool: _RequestPool | None = None
    if request is None:
        pool = _pool_of(compiled)
        running = await pool.acquire()
    else:
        running = request
    try:
        # One generator, no inner one: closing this one must release the request now,
        # not when an abandoned inner generator is collected.
        ports = {port.name: port for port in running.inputs}
        ids_dtype = ports[config.input_ids].dtype
        mask, positions = config.attention_mask, config.position_ids
        picker = sampling.picker()
        running.reset_state()
        stateful = bool(running.query_state())
        sequence, past = list(prompt), 0
        feed = sequence
        for produced in range(1, sampling.max_new_tokens + 1):
            total = past + len(feed)
            inputs = {config.input_ids: np.array([feed], ids_dtype)}
            if mask is not None:
                inputs[mask] = np.ones((1, total), ports[mask].dtype)
            if positions is not None:
                inputs[positions] = np.arange(past, total, dtype=ports[positions].dtype)[None]
            results = await running.infer(inputs, share_inputs=True)
            step = picker.choose(last_logits(results[config.logits], config.logits)[0])
            yield step
            token = step.token
            if sampling.finish_reason(token, produced) is not None:
                return
            sequence.append(token)
            if stateful:
                past, feed = total, [token]
            else:
                feed = sequence
    finally:
        if running.state is RequestState.IDLE:
            running.clear_inputs()  # keeps no step's inputs alive
        if pool is not None:
            pool.release(running)


class _RequestPool:
    """At most ``size`` requests of one compiled model for generations; more wait in
    arrival order."""

    def __init__(self, compiled: CompiledModel, size: int) -> None:
        self.compiled = compiled
        self.free = size
        self.idle: list[AsyncInferRequest] = []
        self.waiters: deque[anyio.Event] = deque()

    async def acquire(self) -> AsyncInferRequest:
        """An idle request (a new one while fewer than ``size`` exist), waiting for one
        in arrival order when all are taken."""
        if self.free > 0 and not self.waiters:
            self.free -= 1
        else:
            event = anyio.Event()  # made here: the pool may serve several event loops
            self.waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                if event.is_set():  # handed a slot as we were cancelled: pass it on
                    self._release()
                else:
                    self.waiters.remove(event)
                raise
        try:
            return self.idle.pop() if self.idle else self.compiled.create_infer_request()
        except BaseException:
            self._release()
            raise

    def release(self, request: AsyncInferRequest) -> None:
        """Take back ``request`` (unless it was closed) and hand its slot on."""
        if request.state is not RequestState.CLOSED:
            self.idle.append(request)
        self._release()

    def _release(self) -> None:
        if self.waiters:
            self.waiters.popleft().set()
        else:
            self.free += 1


_pools: weakref.WeakKeyDictionary[CompiledModel, _RequestPool] = weakref.WeakKeyDictionary()


def _pool_of(compiled: CompiledModel) -> _RequestPool:
    pool = _pools.get(compiled)
    if pool is None:
        size = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        pool = _pools[compiled] = _RequestPool(compiled, max(1, size))
    return pool
