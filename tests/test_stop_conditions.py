"""Stop conditions and streamed text, with a real tokenizer and an executor that emits a
scripted token sequence: EOS, stop token ids, stop strings (never leaked to the client, even
split across tokens), min_tokens, max_tokens and the context length."""

from __future__ import annotations

import pytest

from baton.core.batch import Batch, ExecutorOutput
from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.request import EngineRequest, FinishReason
from baton.core.sampling_params import SamplingParams
from baton.core.text.tokenizer import Tokenizer
from tests.factory import add_request


class ScriptedExecutor:
    """Emits `script` token by token, whatever the request."""

    num_kv_blocks = 64
    block_size = 16

    def __init__(self, script: list[int]) -> None:
        self.script = script

    def execute(self, batch: Batch) -> ExecutorOutput:
        tokens = []
        for seq in batch.sequences:
            if seq.sample:
                tokens.append(self.script[seq.num_output_tokens % len(self.script)])
        return ExecutorOutput(tokens)


@pytest.fixture(scope="module")
def tokenizer(llama_checkpoint) -> Tokenizer:
    return Tokenizer.from_pretrained(llama_checkpoint)


def run(tokenizer, script_text: str, params: SamplingParams, eos_after: bool = True, **kw):
    script = tokenizer.encode(script_text, add_special_tokens=False)
    if eos_after:
        script = [*script, tokenizer.eos_token_id]
    engine = Engine(
        EngineConfig(),
        ScriptedExecutor(script),
        max_model_len=kw.get("max_model_len", 512),
        vocab_size=tokenizer.vocab_size,
        eos_token_ids=[tokenizer.eos_token_id],
        tokenizer=tokenizer,
    )
    add_request(engine, EngineRequest("r", tokenizer.encode("Question:"), params))
    pieces, last = [], None
    while engine.has_unfinished_requests:
        for output in engine.step():
            pieces.append(output.new_text)
            last = output
    return pieces, last


def test_eos_stops_and_is_not_in_the_text(tokenizer):
    pieces, last = run(tokenizer, "The for statement", SamplingParams(max_tokens=100))
    assert "".join(pieces) == "The for statement"
    assert last.finish_reason is FinishReason.STOP
    assert len(pieces) > 2, "text streams in several pieces"


def test_ignore_eos_runs_to_max_tokens(tokenizer):
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    _, last = run(tokenizer, "The for statement", params)
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 30


def test_stop_string_split_across_tokens_is_cut_and_never_streamed(tokenizer):
    params = SamplingParams(max_tokens=100, stop=["statement"])
    pieces, last = run(tokenizer, "The for statement is used", params)
    assert "".join(pieces) == "The for "
    assert all("stat" not in piece for piece in pieces)
    assert last.finish_reason is FinishReason.STOP


def test_earliest_of_several_stop_strings_wins(tokenizer):
    params = SamplingParams(max_tokens=100, stop=["used", "for"])
    pieces, _ = run(tokenizer, "The for statement is used", params)
    assert "".join(pieces) == "The "


def test_stop_token_id_stops(tokenizer):
    script = "The for statement"
    stop_id = tokenizer.encode(script, add_special_tokens=False)[1]
    params = SamplingParams(max_tokens=100, stop_token_ids=[stop_id])
    _, last = run(tokenizer, script, params)
    assert last.finish_reason is FinishReason.STOP and last.num_output_tokens == 2


def test_min_tokens_defers_stopping(tokenizer):
    script = "ab"
    n_script = len(tokenizer.encode(script, add_special_tokens=False))
    params = SamplingParams(max_tokens=100, min_tokens=n_script + 3)
    _, last = run(tokenizer, script, params)
    # The scripted EOS comes too early and is ignored; the next one (a lap later) stops it.
    assert last.finish_reason is FinishReason.STOP
    assert last.num_output_tokens == 2 * (n_script + 1)


def test_max_tokens_and_context_length_finish_with_length(tokenizer):
    _, last = run(tokenizer, "The for statement", SamplingParams(max_tokens=3))
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 3
    prompt_len = len(tokenizer.encode("Question:"))
    _, last = run(
        tokenizer,
        "a b c d e f g h",
        SamplingParams(max_tokens=None, ignore_eos=True),
        max_model_len=prompt_len + 5,
    )
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 5


def test_last_output_carries_timing(tokenizer):
    _, last = run(tokenizer, "The for statement", SamplingParams(max_tokens=100))
    timing = last.timing
    assert last.finished and timing is not None
    assert 0 <= timing.queue_ms <= timing.ttft_ms <= timing.e2e_ms
    assert timing.preemptions == 0 and timing.cached_prompt_tokens == 0
