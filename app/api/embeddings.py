"""OpenAI's `POST /v1/embeddings`: each input's final hidden state, pooled (core/pooling.py) and
L2-normalised, as floats or as base64 of little-endian float32s.

Every input is a prefill-only engine request (`max_tokens` 0 with `pooling`), so embeddings
share the batch, the queue limits and the metrics with generation.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any, Literal

from pydantic import field_validator
from starlette.requests import Request
from starlette.responses import Response

from baton.app.api.body_fields import Int64, Name, StrictModel
from baton.app.api.completion_protocol import Prompt, prompt_list
from baton.app.api.streaming import unless_disconnected
from baton.app.engine.admission import (
    MAX_INLINE_TOKENIZE_CHARS,
    check_capacity,
    check_model,
    max_prompt_chars,
    receive,
    submit,
)
from baton.app.errors import APIError, output_error
from baton.app.state import ServerState, json_response
from baton.core.outputs import RequestOutput
from baton.core.pooling import Pooling
from baton.core.request import EngineRequest
from baton.core.sampling_params import CONTEXT_LENGTH_EXCEEDED, InvalidRequestError, SamplingParams

# OpenAI's own bound on the inputs of one request.
MAX_INPUTS = 2048


class EmbeddingRequest(StrictModel):
    """OpenAI's body; `pooling` is Baton's, for a request that wants other than --pooling."""

    input: Any
    model: Name | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int64 | None = None
    user: Name | None = None
    pooling: Pooling | None = None

    @field_validator("input")
    @classmethod
    def _known_input_shape(cls, value: Any) -> list[Prompt]:
        inputs = prompt_list(value)
        if len(inputs) > MAX_INPUTS:
            raise ValueError(f"may hold at most {MAX_INPUTS} inputs; split the request")
        return inputs

    @property
    def inputs(self) -> list[Prompt]:
        return self.input


async def embeddings(request: Request) -> Response:
    """`{object: list, data: [{object: embedding, index, embedding}], model, usage}`."""
    received = await receive(request, EmbeddingRequest)
    if received is None:
        return Response(status_code=499)  # gone before its body arrived: nobody to answer
    state, arrival_time, parsed = received.state, received.arrival_time, received.body
    check_model(state, parsed.model)
    check_capacity(state, len(parsed.inputs))
    prompts = await _tokenize(state, parsed.inputs)
    response_id = state.next_request_id("embd")
    pooling = parsed.pooling or Pooling(state.settings.pooling)
    params = SamplingParams(max_tokens=0, pooling=pooling)
    requests = []
    for index, token_ids in enumerate(prompts):
        spec = EngineRequest(f"{response_id}-{index}", token_ids, params, arrival_time=arrival_time)
        try:
            requests.append(state.engine.validator.validate(spec))
        except InvalidRequestError as error:
            param = "input" if len(prompts) == 1 else f"input[{index}]"
            raise APIError(400, str(error), param=param, code=error.code) from None
    outputs = await unless_disconnected(request, _run(state, requests))
    if outputs is None:
        return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
    vectors = [output.embedding for output in outputs]
    size = len(vectors[0] or [])
    if parsed.dimensions is not None and parsed.dimensions != size:
        # The model's hidden size is the one size it was trained to embed at; cutting a
        # vector short is only sound for Matryoshka-trained models, which nothing here marks.
        raise APIError(
            400,
            f"dimensions is {parsed.dimensions} but this model's embeddings have {size}; "
            "leave dimensions out",
            param="dimensions",
        )
    num_tokens = sum(len(prompt) for prompt in prompts)
    return json_response(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(v, parsed)}
                for i, v in enumerate(vectors)
            ],
            "model": state.model_name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        }
    )


async def _tokenize(state: ServerState, inputs: list[Prompt]) -> list[list[int]]:
    """Each input's token ids: text with the tokenizer's special tokens, as completions do."""
    tokenizer = state.tokenizer
    limit = max_prompt_chars(tokenizer, state.engine.validator.limits.max_model_len)
    for index, entry in enumerate(inputs):
        if isinstance(entry, str) and len(entry) > limit:
            raise APIError(
                400,
                f"input {index} has {len(entry)} characters, more than the {limit} that could "
                "fit the context length; shorten it",
                param="input",
                code=CONTEXT_LENGTH_EXCEEDED,
            )

    def encode() -> list[list[int]]:
        return [tokenizer.encode(e) if isinstance(e, str) else e for e in inputs]

    num_chars = sum(len(e) for e in inputs if isinstance(e, str))
    if num_chars > MAX_INLINE_TOKENIZE_CHARS:
        return await asyncio.to_thread(encode)
    return encode()


async def _run(state: ServerState, requests: list[EngineRequest]) -> list[RequestOutput]:
    """Each request's final output, in order; a failed one fails the whole response. Leaving
    early (an error, or the client gone and the task cancelled) aborts the rest."""
    streams = submit(state, requests)
    try:
        finals = []
        for stream in streams:
            final = None
            async for output in stream:
                final = output
            assert final is not None and final.finished
            error = output_error(final)
            if error is not None:
                raise error
            if final.embedding is None:
                raise APIError(500, final.error or "the request ended without an embedding")
            finals.append(final)
        return finals
    finally:
        for stream in streams:
            stream.close()


def _encoded(vector: list[float] | None, request: EmbeddingRequest) -> list[float] | str:
    assert vector is not None
    if request.encoding_format == "float":
        return vector
    # What the openai client decodes: the raw little-endian float32 bytes, base64-encoded.
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
