"""vLLM's `POST /tokenize` and `POST /detokenize`: a prompt, or chat messages through the chat
template, to the token ids the server would run, and token ids back to text. They use the
served tokenizer only and run no model, so a client can count tokens or trim a prompt to fit
before sending it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import Field, StrictBool, StrictStr, field_validator
from pydantic_core import PydanticCustomError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from baton.app.api.body_fields import Int64, Name, StrictModel
from baton.app.api.chat_protocol import ChatMessage, template_message
from baton.app.api.guided import MAX_TOOLS, Tool
from baton.app.api.protocol import parse_json_object, validate_request
from baton.app.engine.admission import MAX_INLINE_TOKENIZE_CHARS, check_model
from baton.app.errors import APIError
from baton.app.state import json_response, server_state
from baton.core.text.tokenizer import ChatTemplateError, Tokenizer

T = TypeVar("T")


class TokenizeCompletionRequest(StrictModel):
    """A prompt tokenized as `/v1/completions` tokenizes text: with the tokenizer's special
    tokens (BOS) unless `add_special_tokens` is false."""

    model: Name | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeChatRequest(StrictModel):
    """Messages rendered by the chat template and tokenized as `/v1/chat/completions` does: the
    template writes its own special tokens, so `add_special_tokens` defaults to false."""

    model: Name | None = None
    messages: list[ChatMessage]
    add_generation_prompt: StrictBool = True
    # vLLM's field; Baton's chat endpoint does not continue a final message, so neither does
    # this one: only the value that asks for nothing is accepted.
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool = False
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)

    @field_validator("messages")
    @classmethod
    def _some_messages(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not messages:
            raise PydanticCustomError("baton_empty", "must not be empty; send at least one message")
        return messages

    @field_validator("continue_final_message")
    @classmethod
    def _not_continued(cls, value: bool) -> bool:
        if value:
            raise PydanticCustomError(
                "baton_unsupported",
                "true is not supported: Baton's chat template always closes the final message; "
                "leave it out",
            )
        return value

    def rendered(self, tokenizer: Tokenizer) -> str:
        messages = [template_message(message.model_dump()) for message in self.messages]
        tools = [tool.model_dump(exclude_none=True) for tool in self.tools or []] or None
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=self.add_generation_prompt, tools=tools
        )


class DetokenizeRequest(StrictModel):
    model: Name | None = None
    tokens: list[Int64]


async def tokenize(request: Request) -> Response:
    """`{count, max_model_len, tokens, token_strs}`; `token_strs` is null unless asked for."""
    state = server_state(request)
    body = await _json_body(request)
    if body is None:
        return Response(status_code=499)
    model = TokenizeChatRequest if "messages" in body else TokenizeCompletionRequest
    parsed = validate_request(model, body)
    check_model(state, parsed.model)
    tokenizer = state.tokenizer
    if isinstance(parsed, TokenizeChatRequest):
        size = sum(len(str(value)) for m in parsed.messages for value in m.model_dump().values())

        def encode() -> list[int]:
            text = parsed.rendered(tokenizer)
            return tokenizer.encode(text, add_special_tokens=parsed.add_special_tokens)
    else:
        size = len(parsed.prompt)

        def encode() -> list[int]:
            return tokenizer.encode(parsed.prompt, add_special_tokens=parsed.add_special_tokens)

    try:
        token_ids = await _off_the_loop_if_long(encode, size)
    except ChatTemplateError as error:
        raise APIError(400, str(error), param="messages") from None
    token_strs = tokenizer.convert_ids_to_tokens(token_ids) if parsed.return_token_strs else None
    return json_response(
        {
            "count": len(token_ids),
            "max_model_len": state.engine.validator.limits.max_model_len,
            "tokens": token_ids,
            "token_strs": token_strs,
        }
    )


async def detokenize(request: Request) -> Response:
    """`{prompt}`: the ids' text with special tokens kept, so `/tokenize`'s ids come back as
    the text they were made from."""
    state = server_state(request)
    body = await _json_body(request)
    if body is None:
        return Response(status_code=499)
    parsed = validate_request(DetokenizeRequest, body)
    check_model(state, parsed.model)
    tokenizer = state.tokenizer
    for index, token_id in enumerate(parsed.tokens):
        if not 0 <= token_id < tokenizer.vocab_size:
            raise APIError(
                400,
                f"tokens[{index}] is {token_id}, outside the tokenizer's vocabulary "
                f"[0, {tokenizer.vocab_size}); send ids /tokenize gave",
                param=f"tokens[{index}]",
            )
    text = await _off_the_loop_if_long(
        lambda: tokenizer.decode(parsed.tokens, skip_special_tokens=False), len(parsed.tokens)
    )
    return json_response({"prompt": text})


async def _json_body(request: Request) -> dict[str, Any] | None:
    """The body as a JSON object (a 400 for anything else); None when the client hung up
    before sending it whole, and so will read no answer."""
    try:
        return parse_json_object(await request.body())
    except ClientDisconnect:
        return None


async def _off_the_loop_if_long(work: Callable[[], T], size: int) -> T:
    # Long inputs go to a worker thread, as admission's tokenizing does: the event loop carries
    # every other request's stream meanwhile.
    if size > MAX_INLINE_TOKENIZE_CHARS:
        return await asyncio.to_thread(work)
    return work()
