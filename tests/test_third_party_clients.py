"""The third-party clients users point at Baton, on their common path, unchanged: LangChain's
ChatOpenAI (`bind_tools(tool_choice="any")`, `with_structured_output`) and LiteLLM's
`embedding`. A tiny random model answers; the grammars hold it to the shapes asked for."""

from __future__ import annotations

import math
import os
from typing import Literal

import langchain_openai
import pydantic
import pytest

from baton.core.checkpoint.model_config import ModelConfig
from tests.server_harness import base_url, model_engine, running_server

# LiteLLM reads its model price list from the internet at import unless told to use its copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm


class Forecast(pydantic.BaseModel):
    """The weather in one city."""

    city: Literal["Oslo", "Lima"]
    windy: bool


class GetTime(pydantic.BaseModel):
    """The time in a time zone."""

    zone: Literal["UTC", "CET"]


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=512, max_num_seqs=8)
    with running_server(engine, model_name="tiny", tool_call_parser="hermes") as state:
        yield state


def chat_model(state) -> langchain_openai.ChatOpenAI:
    return langchain_openai.ChatOpenAI(
        model="tiny",
        base_url=f"{base_url(state)}/v1",
        api_key="x",
        temperature=0,
        max_tokens=200,
        max_retries=0,
    )


def test_langchain_bind_tools_with_tool_choice_any_gets_calls(server):
    message = chat_model(server).bind_tools([GetTime], tool_choice="any").invoke("What time?")

    assert message.tool_calls
    assert {call["name"] for call in message.tool_calls} == {"GetTime"}
    assert all(GetTime.model_validate(call["args"]) for call in message.tool_calls)


def test_langchain_with_structured_output_returns_the_model(server):
    forecast = chat_model(server).with_structured_output(Forecast).invoke("The weather?")

    assert isinstance(forecast, Forecast)


def test_litellm_embedding_returns_one_unit_vector_per_input(server, llama_checkpoint):
    hidden_size = ModelConfig.from_pretrained(llama_checkpoint).hidden_size

    response = litellm.embedding(
        model="openai/tiny",
        input=["a first text", "another"],
        api_base=f"{base_url(server)}/v1",
        api_key="x",
    )

    vectors = [item["embedding"] for item in response.data]
    assert len(vectors) == 2 and all(len(v) == hidden_size for v in vectors)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vectors)
    assert response.usage.prompt_tokens > 0
