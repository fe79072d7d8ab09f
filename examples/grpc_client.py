"""A gRPC client of ``aioinfer serve --grpc-port``, with tritonclient's asyncio client.

    python examples/grpc_client.py                       # serves tiny_cnn itself, then asks
    python examples/grpc_client.py --url 127.0.0.1:8001  # asks a running server, e.g.
    aioinfer serve aioinfer/models/tiny_cnn.onnx --grpc-port 8001

Without ``--url`` the script serves the bundled ``tiny_cnn`` model over gRPC on a free
port of 127.0.0.1 (the same :class:`~aioinfer.serving.grpc.GrpcServer` that ``aioinfer
serve --grpc-port`` runs beside REST) and is its client. Either way it shows: health and
metadata, concurrent inferences (the server batches them when the model's config asks),
a stream of requests answered in order on one call (``ModelStreamInfer``), and a
deadline that passes: the server stops the compute and answers the next request.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from aioinfer.models import default_model_path

MODEL = "tiny_cnn"


def images(count: int, seed: int) -> grpcclient.InferInput:
    batch = np.random.default_rng(seed).standard_normal((count, 3, 32, 32)).astype(np.float32)
    tensor = grpcclient.InferInput("image", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)  # sent as raw_input_contents
    return tensor


async def ask(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    try:
        print(f"live {await client.is_server_live()}, ready {await client.is_server_ready()}")
        metadata = await client.get_model_metadata(MODEL)
        ports = ", ".join(f"{t.name} {t.datatype}{list(t.shape)}" for t in metadata.inputs)
        print(f"model {metadata.name} versions {list(metadata.versions)}: {ports}")

        # Eight clients at once: each awaits its own answer.
        results = await asyncio.gather(
            *(client.infer(MODEL, [images(1, seed)], request_id=str(seed)) for seed in range(8))
        )
        classes = [int(r.as_numpy("probabilities").argmax()) for r in results]
        print(f"8 concurrent requests: classes {classes}")

        # One stream, several requests: the answers come back in order.
        async def requests() -> AsyncIterator[dict[str, Any]]:
            for seed in range(3):
                yield {"model_name": MODEL, "inputs": [images(2, seed)], "request_id": f"s{seed}"}

        ids = [result.get_response().id async for result, _ in client.stream_infer(requests())]
        print(f"stream answered {ids}")

        # A deadline that passes cancels the call; the server stops its compute.
        many = images(512, 0)
        try:
            await client.infer(MODEL, [many], client_timeout=0.005)
        except InferenceServerException as exc:
            print(f"512 images with a 5 ms deadline: {exc.status()}")
        start = time.perf_counter()
        result = await client.infer(MODEL, [images(1, 0)])
        elapsed = (time.perf_counter() - start) * 1e3
        print(f"the next request: class {int(result.as_numpy('probabilities').argmax())}", end="")
        print(f" in {elapsed:.0f} ms")
    finally:
        await client.close()


@asynccontextmanager
async def local_server() -> AsyncIterator[str]:
    """tiny_cnn over gRPC on a free port of 127.0.0.1, as ``aioinfer serve`` runs it."""
    from aioinfer.serving import InferenceService, ModelRepository
    from aioinfer.serving.grpc import GrpcServer

    service = InferenceService(ModelRepository(default_model_path()))
    # The lifespan compiles the models, and drains and closes them at the end.
    async with service.lifespan(), GrpcServer(service, "127.0.0.1", 0) as server:
        yield f"127.0.0.1:{server.port}"


async def main(url: str | None) -> None:
    if url is not None:
        await ask(url)
        return
    async with local_server() as local:
        await ask(local)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="host:port of a running server (default: serve one)")
    asyncio.run(main(parser.parse_args().url))
