"""Generation over gRPC, token by token, with tritonclient's asyncio client.

    python examples/grpc_generate_client.py                       # serves a decoder itself
    python examples/grpc_generate_client.py --url 127.0.0.1:8001  # asks a running server

Without ``--url`` the script writes the tiny reciting decoder of
``examples/models/decoder.py`` to a temporary repository, as model ``decoder`` with a
``generate`` config (its ``"."`` ends a generation), and serves it over gRPC on a free
port of 127.0.0.1 (the :class:`~aioinfer.serving.grpc.GrpcServer` that ``aioinfer serve
--grpc-port`` runs). Then, as a client of either server:

- ``ModelStreamInfer``: one response per token as it comes (``token_id``, ``index``); the
  last one has the parameter ``triton_final_response`` true and its ``finish_reason``,
  as Triton's decoupled models answer;
- ``ModelInfer``: the whole generation in one response (``output_ids``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tritonclient.grpc.aio as grpcclient
from models.decoder import build_decoder, decode, encode

MODEL = "decoder"
PROMPT = "aioinfer keeps"


def prompt_tensor(ids: list[int]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("input_ids", [len(ids)], "INT64")
    tensor.set_data_from_numpy(np.array(ids, np.int64))
    return tensor


async def ask(url: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    prompt = encode(PROMPT)
    try:

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": MODEL,
                "inputs": [prompt_tensor(prompt)],
                "parameters": {"max_new_tokens": 8},  # also temperature, top_k, top_p, seed
                "request_id": "story",
            }

        print(f"stream: {PROMPT}", end="", flush=True)
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise error
            token = int(result.as_numpy("token_id")[0])
            print(" " + decode([token]), end="", flush=True)  # as it comes
            parameters = result.get_response().parameters
            if parameters["triton_final_response"].bool_param:
                count = int(result.as_numpy("index")[0]) + 1
                reason = parameters["finish_reason"].string_param
                print(f"\nfinal: True, finish_reason: {reason} ({count} tokens)")

        whole = await client.infer(MODEL, [prompt_tensor(prompt)])  # until "." ends it
        tokens = whole.as_numpy("output_ids").tolist()
        reason = whole.get_response().parameters["finish_reason"].string_param
        print(f"whole: {decode(prompt + tokens)} (finish_reason: {reason})")
    finally:
        await client.close()


@asynccontextmanager
async def local_server() -> AsyncIterator[str]:
    """The reciting decoder as model ``decoder`` over gRPC on a free port of 127.0.0.1."""
    from aioinfer.serving import InferenceService, ModelRepository
    from aioinfer.serving.grpc import GrpcServer

    with tempfile.TemporaryDirectory() as repo:
        version = Path(repo, MODEL, "1")
        version.mkdir(parents=True)
        onnx.save(build_decoder(recite=True), version / "model.onnx")
        config = {"stateful": "auto", "generate": {"eos_token_id": encode(".")}}
        Path(repo, MODEL, "config.json").write_text(json.dumps(config))
        service = InferenceService(ModelRepository(repo))
        # The lifespan compiles the model, and drains and closes it at the end.
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
