"""A client that goes away: its inference stops, and the request serves the next client.

    python examples/cancellation.py [--batch 64] [--timeout-ms 5] [--backend asyncio|trio]

A web handler awaits ``request.infer``; when the client disconnects or a deadline passes,
the framework cancels the handler's task. aioinfer turns that cancellation into a stop of
the compute at the next kernel boundary: no thread keeps computing for nobody, and the
request is idle (and reusable) by the time the cancellation reaches the handler.
"""

from __future__ import annotations

import argparse
import time

import anyio
import numpy as np

import aioinfer as ai
from aioinfer.models import default_model_path


async def handle(request: ai.InferRequest, images: np.ndarray, timeout: float) -> str:
    """What a web handler does: infer, but give up after ``timeout`` seconds."""
    start = time.perf_counter()
    with anyio.move_on_after(timeout) as scope:  # a deadline, or a client that went away
        results = await request.infer({"image": images})
        return f"answered in {_ms(start)}: classes {results[0].argmax(axis=1)[:8].tolist()}"
    # The task was cancelled; by now the compute has stopped and the request is idle.
    assert scope.cancelled_caught
    return f"client gone after {_ms(start)}; request {request.state.value}, {request.error!r}"


async def main(batch: int, timeout: float) -> None:
    compiled = await ai.Core().compile_model_async(default_model_path(), "CPU")
    images = np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    async with compiled.create_infer_request() as request:
        start = time.perf_counter()
        await request.infer({"image": images})
        print(f"a full inference of {batch} images takes {_ms(start)}")

        print("impatient client:", await handle(request, images, timeout))
        print("patient client:  ", await handle(request, images[:8], timeout=60.0))

        # Two clients at once on two requests; one of them disconnects (its task group
        # is cancelled), the other one is not disturbed.
        other = compiled.create_infer_request()
        async with anyio.create_task_group() as clients:

            async def disconnecting() -> None:
                with anyio.CancelScope() as scope:
                    clients.start_soon(_cancel_soon, scope, timeout)
                    await request.infer({"image": images})
                print("disconnected client: request", request.state.value)

            async def staying() -> None:
                results = await other.infer({"image": images[:4]})
                print("staying client:      classes", results[0].argmax(axis=1).tolist())

            clients.start_soon(disconnecting)
            clients.start_soon(staying)
        await other.close()


async def _cancel_soon(scope: anyio.CancelScope, delay: float) -> None:
    await anyio.sleep(delay)
    scope.cancel()


def _ms(start: float) -> str:
    return f"{(time.perf_counter() - start) * 1e3:.1f} ms"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--timeout-ms", type=float, default=5.0)
    parser.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    args = parser.parse_args()
    anyio.run(main, args.batch, args.timeout_ms / 1e3, backend=args.backend)
