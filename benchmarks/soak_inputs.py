"""The soak test's bad and extreme inputs: HTTP bodies that must get a 4xx, well-typed extreme
values that may get a 2xx or a 4xx, and WebSocket frames that must get an error frame."""

from __future__ import annotations

from typing import Any

import orjson

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def bad_inputs(max_model_len: int) -> dict[str, tuple[str, bytes]]:
    """HTTP bodies that must be refused with a 4xx: name → (path, raw body)."""
    ok = {"prompt": "hello there", "max_tokens": 4}
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    raw = {
        "malformed_json": b'{"prompt": "hi", "max_tokens": ',
        "not_an_object": b"[1, 2, 3]",
        "invalid_utf8": b'{"prompt": "\xff\xfe"}',
        "lone_surrogate": b'{"prompt": "\\ud800"}',
        "nan": b'{"prompt": "hi", "temperature": NaN}',
        "deep_nesting": b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "oversized_body": b'{"prompt": "' + b"a" * (5 << 20) + b'"}',
        "prompt_ids_past_int64": b'{"prompt": [5, 100000000000000000000000000000]}',
    }
    completions = {
        "max_tokens_string": {"max_tokens": "16"},
        "max_tokens_negative": {"max_tokens": -1},
        "max_tokens_zero": {"max_tokens": 0},
        "max_tokens_1e308": {"max_tokens": 1e308},
        "max_tokens_past_context": {"max_tokens": 10**18},
        "temperature_negative": {"temperature": -1.0},
        "temperature_1e308": {"temperature": 1e308},
        "top_p_1e308": {"top_p": 1e308},
        "top_p_zero": {"top_p": 0.0},
        "top_k_string": {"top_k": "all"},
        "presence_penalty_-1e308": {"presence_penalty": -1e308},
        "logprobs_1e308": {"logprobs": 1e308},
        "n_5": {"n": 5},
        "seed_1e308": {"seed": 1e308},
        "stop_integers": {"stop": [1, 2]},
        "min_tokens_over_max": {"min_tokens": 8},
        "stream_string": {"stream": "yes"},
        "unknown_model": {"model": "no-such-model"},
        "prompt_null": {"prompt": None},
        "prompt_empty": {"prompt": ""},
        "prompt_empty_list": {"prompt": []},
        "prompt_ids_out_of_vocab": {"prompt": [5, 10**9]},
        "prompt_ids_negative": {"prompt": [-1, 5]},
        "prompt_ids_past_context": {"prompt": [5] * (max_model_len + 1)},
    }
    chats = {
        "chat_unknown_model": {"model": "no-such-model"},
        "chat_empty_messages": {"messages": []},
        "chat_messages_string": {"messages": "hello"},
        "chat_message_without_role": {"messages": [{"content": "hi"}]},
        "chat_image_content": {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]
        },
        "chat_max_completion_tokens_negative": {"max_completion_tokens": -1},
        "chat_top_logprobs_alone": {"top_logprobs": 2},
    }
    cases = {name: (COMPLETIONS, body) for name, body in raw.items()}
    cases |= {name: (COMPLETIONS, orjson.dumps({**ok, **b})) for name, b in completions.items()}
    cases |= {name: (CHAT, orjson.dumps({**chat, **body})) for name, body in chats.items()}
    cases["prompt_missing"] = (COMPLETIONS, b'{"max_tokens": 4}')
    return cases


def edge_inputs(max_model_len: int) -> dict[str, dict[str, Any]]:
    """Extreme but well-typed completion fields: serving or refusing them is fine, 5xx is not."""
    return {
        "temperature_1e-308": {"temperature": 1e-308},
        "top_p_1e-308": {"top_p": 1e-308, "temperature": 1.0},
        "top_k_huge": {"top_k": 10**18, "temperature": 1.0},
        "min_p_one": {"min_p": 1.0, "temperature": 1.0},
        "repetition_penalty_1e-308": {"repetition_penalty": 1e-308},
        "repetition_penalty_1e308": {"repetition_penalty": 1e308},
        "seed_negative": {"seed": -1, "temperature": 1.0},
        "seed_int64_max": {"seed": 2**63 - 1, "temperature": 1.0},
        "priority_huge": {"priority": 10**18},
        "priority_negative_huge": {"priority": -(10**18)},
        "slo_extreme": {"slo": {"ttft_ms": 1e308, "tpot_ms": 1e-300}},
        "stop_token_ids_out_of_vocab": {"stop_token_ids": [10**9]},
        "min_tokens_equal_max": {"min_tokens": 4, "ignore_eos": True},
        "stop_many": {"stop": ["x"] * 1000},
        "prompt_ids_fill_context": {"prompt": [5] * (max_model_len - 1), "max_tokens": 1},
    }


def bad_frames() -> dict[str, str | bytes]:
    """WebSocket frames that must get an error frame (and leave the socket open)."""
    ok = {"type": "generate", "id": "bad", "prompt": "hello there", "max_tokens": 4}
    frames = {
        "no_id": {key: value for key, value in ok.items() if key != "id"},
        "boolean_id": {**ok, "id": True},
        "unknown_type": {**ok, "type": "launch"},
        "prompt_and_messages": {**ok, "messages": [{"role": "user", "content": "hi"}]},
        "two_prompts": {**ok, "prompt": ["a", "b"]},
        "max_tokens_1e308": {**ok, "max_tokens": 1e308},
        "max_tokens_negative": {**ok, "max_tokens": -1},
        "unknown_model": {**ok, "model": "no-such-model"},
        "empty_messages": {"type": "generate", "id": "bad", "messages": []},
        "prompt_ids_out_of_vocab": {**ok, "prompt": [5, 10**9]},
    }
    return {
        "malformed_json": '{"type": "generate", "id": ',
        "not_an_object": "[1, 2]",
        "invalid_utf8_binary": b"\xff\xfe\xfd",
        **{name: orjson.dumps(frame).decode() for name, frame in frames.items()},
    }
