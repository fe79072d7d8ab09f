"""FastAPI + aioinfer.generate: tokens streamed to the client as server-sent events.

    pip install 'aioinfer[serve]' fastapi
    uvicorn examples.generate_fastapi:app --port 8000
    curl -N localhost:8000/generate -H 'content-type: application/json' \\
         -d '{"prompt": "aioinfer keeps", "max_new_tokens": 8}'

``POST /generate`` answers ``text/event-stream``: one ``data: {"token": ..., "index":
...}`` event per word as the decoder produces it, then ``data: [DONE]``. The model is
the tiny reciting decoder of ``examples/models/decoder.py``, compiled in the app's
lifespan with its KV cache in the request (``STATEFUL: auto``).

Each step runs only when the response asks for the next token. When the client goes
away, Starlette cancels the response's task: the step that runs is cancelled between
kernels and the generation ends, its request back in the pool.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

import aioinfer as ai
from examples.models.decoder import MAX_POSITIONS, build_decoder, decode, encode

END = encode(".")
"""The decoder's end of sentence: a generation stops after it."""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.compiled = await ai.Core().compile_model_async(
        build_decoder(recite=True), "CPU", {"STATEFUL": "auto"}
    )
    yield
    await app.state.compiled.close()


app = FastAPI(lifespan=lifespan)


class Prompt(BaseModel):
    prompt: str
    max_new_tokens: int = Field(16, ge=1, le=MAX_POSITIONS // 2)
    temperature: float = Field(0.0, ge=0.0)
    seed: int | None = Field(None, ge=0)


@app.post("/generate")
async def generate(body: Prompt, request: Request) -> StreamingResponse:
    try:
        prompt = encode(body.prompt)
    except ValueError:
        raise HTTPException(422, "the prompt may only use the words of the sentence") from None
    if not prompt or len(prompt) > MAX_POSITIONS // 2:
        raise HTTPException(422, f"the prompt must have 1 to {MAX_POSITIONS // 2} words")
    tokens = ai.generate(
        request.app.state.compiled,
        prompt,
        max_new_tokens=body.max_new_tokens,
        temperature=body.temperature,
        seed=body.seed,
        stop=END,
    )
    return StreamingResponse(events(tokens), media_type="text/event-stream")


async def events(tokens: AsyncGenerator[int, None]) -> AsyncIterator[str]:
    """One server-sent event per token, then ``[DONE]``."""
    async with aclosing(tokens):
        index = 0
        async for token in tokens:
            yield f"data: {json.dumps({'token': decode([token]), 'index': index})}\n\n"
            index += 1
    yield "data: [DONE]\n\n"
