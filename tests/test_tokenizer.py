"""baton.core.text.tokenizer against transformers' AutoTokenizer: ids, text and rendered chat
templates."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from baton.core.text.tokenizer import ChatTemplateError, NoChatTemplateError, Tokenizer

TEXTS = [
    "",
    "Hello world",
    " leading space and trailing spaces  ",
    "tabs\tand\nnew lines\n\n\n",
    "accents: héllo naïve café Ünïcödé",
    "CJK: 中文字符 日本語のテキスト 한국어",
    "emoji: 😀 👍🏽 👨‍👩‍👧 🇺🇳",
    "combining e\u0301 and zero\u200bwidth",
    "right to left: עברית العربية",
    "code: def f(x):\n    return x ** 2  # squared",
    "special <|end|> in the middle",
    "<|begin|>already starts with bos",
]

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if system_message %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

CHATML_TOOLS_TEMPLATE = """{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}
# Tools

You may call these functions:
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{% for message in messages %}
{% if message.role == 'system' %}{% continue %}{% endif %}
<|im_start|>{{ message.role }}
{% if message.content is defined %}
{% generation %}{{ message.content }}{% endgeneration %}
{% endif %}
{% for call in message.tool_calls | default([]) %}
<tool_call>
{{ call.function | tojson(indent=2) }}
</tool_call>
{% endfor %}
<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

CHAT = [
    {"role": "system", "content": "  You are terse. Réponds en français si besoin.  "},
    {"role": "user", "content": "What is 2 + 2? 🤔"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 中文?"},
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": 'Weather for a city, e.g. <Zürich> & "Genève"',
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

TOOL_CHAT = [
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
    },
    {"role": "tool", "content": '{"temp_c": 21}'},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, hf_tokenizer) -> Path:
    """The test tokenizer as transformers saves it (template in chat_template.jinja)."""
    out = tmp_path_factory.mktemp("tokenizer")
    hf_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(folder) -> Tokenizer:
    return Tokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def oracle(folder):
    return AutoTokenizer.from_pretrained(folder)


def custom_folder(tmp_path: Path, hf_tokenizer, *, jinja: str | None = None, **config) -> Path:
    """The test tokenizer saved with `config` merged into tokenizer_config.json and
    chat_template.jinja replaced by `jinja` (removed when None)."""
    hf_tokenizer.save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **config}))
    (tmp_path / "chat_template.jinja").unlink()
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return tmp_path


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(tokenizer, oracle, text, add_special_tokens):
    expected = oracle.encode(text, add_special_tokens=add_special_tokens)
    assert tokenizer.encode(text, add_special_tokens=add_special_tokens) == expected


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_transformers(tokenizer, oracle, text, skip):
    ids = oracle.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=skip) == oracle.decode(
        ids, skip_special_tokens=skip
    )


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_decode_of_any_ids_matches_transformers(tokenizer, oracle, data):
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=40))
    skip = data.draw(st.booleans())
    assert tokenizer.decode(ids, skip) == oracle.decode(ids, skip_special_tokens=skip)


def test_vocabulary_and_special_tokens_match_transformers(tokenizer, oracle):
    assert tokenizer.vocab_size == len(oracle) == 512
    ours = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert ours == (oracle.bos_token_id, oracle.eos_token_id, oracle.pad_token_id) == (0, 1, 2)
    assert tokenizer.all_special_ids == set(oracle.all_special_ids) == {0, 1, 2}
    ids = list(range(tokenizer.vocab_size))
    assert tokenizer.convert_ids_to_tokens(ids) == oracle.convert_ids_to_tokens(ids)


def test_loads_from_a_model_checkpoint_folder(llama_checkpoint):
    tokenizer = Tokenizer.from_pretrained(llama_checkpoint)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|begin|><|user|>\nhi<|end|>\n<|assistant|>\n"
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_checkpoint_template_matches_transformers(tokenizer, oracle, add_generation_prompt):
    for messages in (CHAT, CHAT[1:2], [{"role": "user", "content": ""}]):
        expected = oracle.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert tokenizer.apply_chat_template(messages, add_generation_prompt) == expected


def test_encoded_chat_has_one_bos_and_matches_transformers(tokenizer, oracle):
    ids = tokenizer.encode_chat(CHAT)
    assert ids == oracle.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1
    # Why encode_chat turns special tokens off: the default would put a second BOS in front.
    rendered = tokenizer.apply_chat_template(CHAT)
    assert tokenizer.encode(rendered)[:2] == [tokenizer.bos_token_id] * 2


def test_llama3_style_template_matches_transformers(tmp_path, hf_tokenizer):
    headers = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    folder = custom_folder(
        tmp_path,
        hf_tokenizer,
        chat_template=LLAMA3_TEMPLATE,
        additional_special_tokens=headers,
        bos_token={"__type": "AddedToken", "content": "<|begin|>", "special": True},
    )
    ours, oracle = Tokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    for messages in (CHAT, CHAT[1:]):
        expected = oracle.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(messages) == expected
        assert ours.encode_chat(messages) == oracle.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=False
        )
    # The header tokens became special: one id each, and skipped when decoding.
    assert ours.vocab_size == len(oracle) == 515
    assert ours.all_special_ids == set(oracle.all_special_ids)
    ids = ours.encode_chat(CHAT[1:2])
    assert ours.decode(ids) == "user\n\nWhat is 2 + 2? 🤔assistant\n\n"


def test_chatml_template_with_tools_matches_transformers(tmp_path, hf_tokenizer):
    folder = custom_folder(tmp_path, hf_tokenizer, chat_template=CHATML_TOOLS_TEMPLATE)
    ours, oracle = Tokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    for messages, tools in ((CHAT, None), (TOOL_CHAT, [WEATHER_TOOL]), (CHAT, [WEATHER_TOOL])):
        expected = oracle.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        assert ours.apply_chat_template(messages, tools=tools) == expected
    rendered = ours.apply_chat_template(TOOL_CHAT, tools=[WEATHER_TOOL])
    # tojson as in transformers: key order kept, non-ASCII and <>& left as they are.
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in rendered
    assert '"city": "Zürich"' in rendered
    assert "None" not in rendered


def test_named_templates_use_default_and_tool_use_like_transformers(tmp_path, hf_tokenizer):
    named = [
        {"name": "default", "template": LLAMA3_TEMPLATE},
        {"name": "tool_use", "template": CHATML_TOOLS_TEMPLATE},
    ]
    folder = custom_folder(tmp_path, hf_tokenizer, chat_template=named)
    ours, oracle = Tokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    for tools in (None, [WEATHER_TOOL]):
        expected = oracle.apply_chat_template(
            CHAT, tools=tools, tokenize=False, add_generation_prompt=True
        )
        assert ours.apply_chat_template(CHAT, tools=tools) == expected
    assert ours.apply_chat_template(CHAT).startswith("<|begin|><|start_header_id|>system")


def test_named_templates_saved_as_files_are_read_like_transformers(tmp_path, hf_tokenizer):
    # transformers saves the default as chat_template.jinja and the others in
    # additional_chat_templates/, with none left in tokenizer_config.json.
    hf_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(CHATML_TOOLS_TEMPLATE)
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    ours, oracle = Tokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert sorted(ours.chat_templates) == ["default", "tool_use"]
    for tools in (None, [WEATHER_TOOL]):
        expected = oracle.apply_chat_template(
            CHAT, tools=tools, tokenize=False, add_generation_prompt=True
        )
        assert ours.apply_chat_template(CHAT, tools=tools) == expected


def test_chat_template_jinja_file_wins_over_config(tmp_path, hf_tokenizer):
    folder = custom_folder(
        tmp_path, hf_tokenizer, chat_template="from config", jinja="from {{ 'file' }}"
    )
    oracle = AutoTokenizer.from_pretrained(folder)
    rendered = Tokenizer.from_pretrained(folder).apply_chat_template(CHAT)
    assert rendered == "from file" == oracle.apply_chat_template(CHAT, tokenize=False)


def test_extra_variables_reach_the_template_and_strftime_now_works(tmp_path, hf_tokenizer):
    template = "{{ strftime_now('%Y') }}|{{ enable_thinking }}|{{ eos_token }}"
    folder = custom_folder(tmp_path, hf_tokenizer, jinja=template)
    rendered = Tokenizer.from_pretrained(folder).apply_chat_template(CHAT, enable_thinking=False)
    assert re.fullmatch(r"\d{4}\|False\|<\|end\|>", rendered)
    assert rendered[:4] in {time.strftime("%Y"), str(int(time.strftime("%Y")) - 1)}


def test_template_exception_becomes_a_chat_template_error(tmp_path, hf_tokenizer):
    folder = custom_folder(tmp_path, hf_tokenizer, chat_template=LLAMA3_TEMPLATE)
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match=r"roles must alternate.*/v1/completions"):
        Tokenizer.from_pretrained(folder).apply_chat_template(two_users)


def test_missing_chat_template_says_what_to_do(tmp_path, hf_tokenizer):
    tokenizer = Tokenizer.from_pretrained(custom_folder(tmp_path, hf_tokenizer))
    with pytest.raises(NoChatTemplateError, match=r"no chat template.*/v1/completions") as error:
        tokenizer.encode_chat(CHAT)
    assert isinstance(error.value, ValueError)
    assert tokenizer.encode("still encodes") == [0, *tokenizer.encode("still encodes", False)]


def test_invalid_jinja_and_missing_default_are_reported(tmp_path, hf_tokenizer):
    broken = Tokenizer.from_pretrained(custom_folder(tmp_path, hf_tokenizer, jinja="{% if %}"))
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        broken.apply_chat_template(CHAT)
    named = [{"name": "rag", "template": "x"}]
    folder = custom_folder(tmp_path / "named", hf_tokenizer, chat_template=named)
    with pytest.raises(ChatTemplateError, match=r"\['rag'\].*'default'"):
        Tokenizer.from_pretrained(folder).apply_chat_template(CHAT)


def test_missing_tokenizer_json_names_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no tokenizer.json in {re.escape(str(tmp_path))}"):
        Tokenizer.from_pretrained(tmp_path)
