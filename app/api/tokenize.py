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
from baton.app.api.chat_protocol import ChatCompletionRequest, ChatMessage, ReasoningEffort
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
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool = False
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)

    @field_validator("messages")
    @classmethod
    def _some_messages(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not messages:
            raise PydanticCustomError("baton_empty", "must not be empty; send at least one message")
        return messages

    def rendered(self, tokenizer: Tokenizer) -> str:
        """The prompt text `/v1/chat/completions` would render for these fields: the chat
        request's own checks and template variables, so the two never disagree."""
        chat = validate_request(
            ChatCompletionRequest,
            self.model_dump(include=CHAT_TEMPLATE_FIELDS, exclude_none=True),
        )
        return tokenizer.apply_chat_template(
            chat.message_dicts(),
            chat.add_generation_prompt,
            chat.continue_final_message,
            **chat.template_variables(),
        )


# What of a tokenize body the chat template reads, as /v1/chat/completions takes it.
CHAT_TEMPLATE_FIELDS = {
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "reasoning_effort",
}


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
