"""The checkpoint's own defaults: generation_config.json's sampling fields fill what a request
leaves out (`--generation-config auto|none|FOLDER`), a request's own values win, and
`--chat-template` replaces the checkpoint's chat template; on the server, WebSocket frames and
the offline `LLM`."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from baton.app.api.chat_protocol import ChatCompletionRequest
from baton.app.api.completion_protocol import CompletionRequest
from baton.app.llm import LLM
from baton.app.request_defaults import read_request_defaults
from baton.core.checkpoint.generation_config import (
    NO_DEFAULTS,
    SamplingDefaults,
    read_sampling_defaults,
)
from baton.core.config import EngineConfig
from baton.core.request import EngineRequest
from baton.core.request_validator import ModelLimits, RequestValidator
from baton.core.sampling_params import SamplingParams
from baton.core.text.tokenizer import ChatTemplateError, Tokenizer
from tests.server_harness import base_url, running_server, simulated_engine

# What a model author recommends, as Qwen's and Llama's files spell it; do_sample and the
# search settings are transformers' generate() options, not request defaults.
GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "max_new_tokens": 5,
    "num_beams": 1,
}
FOLDER_DEFAULTS = SamplingDefaults(
    temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05, max_tokens=5
)
# A template unlike the checkpoint's, so the prompt it renders is told apart by its length.
OVERRIDE_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>"
CHAT = [{"role": "user", "content": "Say something."}]
OWN = {"temperature": 0.0, "top_p": 0.5, "top_k": 3, "repetition_penalty": 1.0, "max_tokens": 7}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, llama_checkpoint) -> Path:
    """The tiny llama with a generation_config.json that recommends sampling defaults."""
    folder = tmp_path_factory.mktemp("genconfig") / "model"
    shutil.copytree(llama_checkpoint, folder)
    file = folder / "generation_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **GENERATION_CONFIG}))
    return folder


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value))
    return path


def test_sampling_fields_are_read_and_max_new_tokens_becomes_max_tokens(checkpoint):
    assert read_sampling_defaults(checkpoint / "generation_config.json") == FOLDER_DEFAULTS
    assert FOLDER_DEFAULTS.describe() == (
        "temperature 0.6, top_p 0.95, top_k 20, repetition_penalty 1.05, max_tokens 5"
    )


def test_do_sample_false_and_transformers_own_defaults_set_nothing(tmp_path):
    # An older save_pretrained wrote every transformers default; none of them is a choice.
    dump = {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None}
    assert read_sampling_defaults(write_json(tmp_path / "g.json", dump)) == NO_DEFAULTS
    # do_sample false does not make the defaults greedy (as in vLLM): the values still apply.
    chosen = {"do_sample": False, "temperature": 0.7, "min_p": 0.05}
    assert read_sampling_defaults(write_json(tmp_path / "h.json", chosen)) == SamplingDefaults(
        temperature=0.7, min_p=0.05
    )
    assert read_sampling_defaults(tmp_path / "absent.json") == NO_DEFAULTS


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ({"top_p": 0}, r"top_p is unusable \(top_p must be in \(0, 1\]"),
        ({"max_new_tokens": "64"}, "max_new_tokens is unusable"),
        ({"max_new_tokens": 0}, "max_new_tokens 0 would generate nothing"),
        ([1, 2], "must hold a JSON object"),
    ],
)
def test_an_unusable_file_fails_at_start_up_naming_the_value_and_the_way_out(
    tmp_path, content, fragment
):
    file = write_json(tmp_path / "generation_config.json", content)
    with pytest.raises(ValueError, match=fragment) as error:
        read_request_defaults(tmp_path)
    assert str(file) in str(error.value) and "--generation-config none" in str(error.value)
    assert read_request_defaults(tmp_path, "none").sampling == NO_DEFAULTS


def test_generation_config_none_ignores_the_file_and_a_folder_replaces_it(checkpoint, tmp_path):
    assert read_request_defaults(checkpoint).sampling == FOLDER_DEFAULTS
    assert read_request_defaults(checkpoint, "none").sampling == NO_DEFAULTS
    write_json(tmp_path / "generation_config.json", {"temperature": 0.3})
    replaced = read_request_defaults(checkpoint, str(tmp_path)).sampling
    assert replaced == SamplingDefaults(temperature=0.3)
    with pytest.raises(ValueError, match=r"--generation-config .*auto .*none"):
        read_request_defaults(checkpoint, str(tmp_path / "missing"))


def test_a_request_that_omits_sampling_fields_gets_the_folders_and_keeps_its_own():
    chat = ChatCompletionRequest.model_validate({"messages": CHAT, "temperature": None})
    params = chat.sampling_params(FOLDER_DEFAULTS)
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.95, 20)
    assert (params.repetition_penalty, params.min_p) == (1.05, 0.0)
    # Left unset here: the validator bounds the folder's max_tokens by the prompt's room.
    assert params.max_tokens is None
    own = ChatCompletionRequest.model_validate({"messages": CHAT, **OWN})
    params = own.sampling_params(FOLDER_DEFAULTS)
    assert {name: getattr(params, name) for name in OWN} == OWN
    assert chat.sampling_params().temperature == 1.0  # no defaults: OpenAI's
    # Completions' own default of 16 tokens gives way to the folder's.
    completion = CompletionRequest.model_validate({"prompt": "x"})
    assert completion.sampling_params().max_tokens == 16
    assert completion.sampling_params(FOLDER_DEFAULTS).max_tokens is None


def test_the_folders_max_tokens_caps_what_fits_and_never_causes_a_refusal():
    limits = ModelLimits(max_model_len=64, vocab_size=100, num_kv_blocks=100, block_size=16)
    validator = RequestValidator(EngineConfig(), limits)

    def resolved(params: SamplingParams, default: int | None) -> int | None:
        request = EngineRequest("r", list(range(60)), params)
        return validator.validate(request, default).sampling_params.max_tokens

    unset = SamplingParams(max_tokens=None)
    assert resolved(unset, None) == 4  # what fits the context
    assert resolved(unset, 3) == 3
    assert resolved(unset, 4096) == 4  # a default beyond the context is cut, not refused
    assert resolved(SamplingParams(max_tokens=None, min_tokens=4), 2) == 4  # min_tokens wins
    assert resolved(SamplingParams(max_tokens=2), 3) == 2  # a request's own value wins


def test_a_chat_template_file_or_inline_text_replaces_the_checkpoints(checkpoint, tmp_path):
    tokenizer = Tokenizer.from_pretrained(checkpoint)
    expected = "[user] Say something.\n>"
    file = tmp_path / "template.jinja"
    file.write_text(OVERRIDE_TEMPLATE)
    for value in (str(file), OVERRIDE_TEMPLATE):
        defaults = read_request_defaults(checkpoint, chat_template=value)
        rendered = defaults.tokenizer_for(tokenizer).apply_chat_template(CHAT)
        assert rendered == expected
        # With tools too: the override is the one template.
        tools = [{"type": "function", "function": {"name": "f"}}]
        assert defaults.tokenizer_for(tokenizer).apply_chat_template(CHAT, tools=tools) == expected
    assert tokenizer.apply_chat_template(CHAT) != expected


def test_a_missing_or_broken_chat_template_is_one_line_at_start_up(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^--chat-template: no file \S+/nope.jinja; "):
        read_request_defaults(checkpoint, chat_template=str(tmp_path / "nope.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m }}")
    with pytest.raises(ChatTemplateError) as error:
        read_request_defaults(checkpoint, chat_template=str(broken))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"the chat template {broken} is not valid Jinja (line 1: ")
    assert message.endswith("leave --chat-template out")


def test_the_offline_llm_samples_with_the_folders_defaults_unless_given_params(checkpoint):
    llm = LLM(checkpoint, device="cpu", num_kv_blocks=64, chat_template=OVERRIDE_TEMPLATE)
    assert llm.default_sampling_params() == FOLDER_DEFAULTS.apply_to(SamplingParams())
    given = llm.generate("Once upon a time", SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(given[0].token_ids) == 8  # params passed in are taken whole
    assert len(llm.generate("Once upon a time")[0].token_ids) <= 5
    assert llm.tokenizer.apply_chat_template(CHAT) == "[user] Say something.\n>"


@pytest.fixture(scope="module")
def server(checkpoint):
    defaults = read_request_defaults(checkpoint, chat_template=OVERRIDE_TEMPLATE)
    engine = simulated_engine(checkpoint, max_model_len=512, num_kv_blocks=128)
    with running_server(engine, defaults=defaults) as state:
        yield state


@pytest.fixture
def submitted(server, monkeypatch) -> list[EngineRequest]:
    """The engine requests the server submits, as the engine receives them."""
    requests: list[EngineRequest] = []
    submit = server.engine.submit

    def capture(adds: list[EngineRequest]):
        requests.extend(adds)
        return submit(adds)

    monkeypatch.setattr(server.engine, "submit", capture)
    return requests


def test_the_server_fills_omitted_fields_and_caps_the_output_at_max_new_tokens(server, submitted):
    body = {"messages": CHAT, "ignore_eos": True}
    response = httpx.post(f"{base_url(server)}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["completion_tokens"] == 5
    (request,) = submitted
    params = request.sampling_params
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.95, 20)
    assert (params.repetition_penalty, params.max_tokens) == (1.05, 5)
    # The prompt is --chat-template's rendering, not the checkpoint's template.
    rendered = server.tokenizer.encode("[user] Say something.\n>", add_special_tokens=False)
    assert request.prompt_token_ids == rendered
    assert usage["prompt_tokens"] == len(rendered)


def test_the_server_keeps_what_a_request_sets(server, submitted):
    body = {"prompt": "Hello", "ignore_eos": True, **OWN}
    response = httpx.post(f"{base_url(server)}/v1/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 7
    params = submitted[0].sampling_params
    assert {name: getattr(params, name) for name in OWN} == OWN


def test_websocket_frames_get_the_same_defaults(server, submitted):
    async def run() -> list[dict]:
        url = f"ws://127.0.0.1:{server.settings.port}/v1/ws"
        frames = []
        async with connect(url) as ws:
            frame = {"type": "generate", "id": "a", "prompt": "Hi", "ignore_eos": True}
            await ws.send(orjson.dumps(frame).decode())
            while not frames or frames[-1]["type"] not in ("done", "error"):
                frames.append(json.loads(await ws.recv()))
        return frames

    frames = asyncio.run(run())
    assert frames[-1]["type"] == "done", frames[-1]
    assert frames[-1]["usage"]["completion_tokens"] == 5
    assert submitted[0].sampling_params.temperature == 0.6


def test_the_defaults_in_force_are_logged_in_one_line_each(checkpoint, caplog):
    caplog.set_level(logging.INFO, logger="baton.server")
    read_request_defaults(checkpoint, chat_template=OVERRIDE_TEMPLATE).log()
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        f"sampling defaults from {checkpoint / 'generation_config.json'}: "
        f"{FOLDER_DEFAULTS.describe()}",
        "chat template from --chat-template: given inline",
    ]
