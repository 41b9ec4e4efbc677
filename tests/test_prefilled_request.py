"""A request prefilled on one engine and decoded on another (core/prefilled.py): the same
tokens as on one engine, the prefill side's blocks held until the transfer ends, the prompt's
prefix-cache hashes registered on the decode side, the KV hook called with what was read,
preemption on the decode side recomputing from the prompt, and the text continuing across the
seam."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from baton.core.engine import Engine
from baton.core.prefilled import PrefilledRequest
from baton.core.simulation.simulated_executor import SimulatedExecutor
from baton.core.text.tokenizer import Tokenizer
from tests.factory import add_request, make_engine, make_request
from tests.test_detokenizer import sentencepiece_style_tokenizer

PROMPTS = {f"r{i}": [(7 * i + j) % 997 + 1 for j in range(20 + 37 * i)] for i in range(6)}


def _run(engine: Engine) -> dict[str, list[int]]:
    """Step until idle; each request's tokens, and prefilled requests handed off."""
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    return tokens


def _prefill(engine: Engine, max_tokens: int = 12) -> dict[str, PrefilledRequest]:
    for request_id, prompt in PROMPTS.items():
        spec = engine.validator.validate(make_request(request_id, prompt, max_tokens=max_tokens))
        engine.add_request(spec, hand_off=True)
    handed: dict[str, PrefilledRequest] = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            assert not output.finished
            assert output.prefilled is not None and len(output.new_token_ids) == 1
            assert output.prefilled.first_token_id == output.new_token_ids[0]
            handed[output.request_id] = output.prefilled
    return handed


def _together(max_tokens: int = 12) -> dict[str, list[int]]:
    engine = make_engine(max_num_batched_tokens=64)
    for request_id, prompt in PROMPTS.items():
        add_request(engine, make_request(request_id, prompt, max_tokens=max_tokens))
    return _run(engine)


def test_prefilled_on_one_engine_and_decoded_on_another_gives_the_same_tokens():
    prefill = make_engine(max_num_batched_tokens=48)
    handed = _prefill(prefill)
    prefill_tokens = []
    decode = make_engine(
        max_num_batched_tokens=64, on_batch=lambda b: prefill_tokens.append(b.num_prefill_tokens)
    )
    for prefilled in handed.values():
        decode.add_prefilled(prefilled)
    continued = _run(decode)
    # It decodes from the transferred KV: no prompt token is computed again.
    assert prefill_tokens and not any(prefill_tokens)
    expected = _together()
    assert {rid: [handed[rid].first_token_id, *continued[rid]] for rid in handed} == expected
    assert all(len(tokens) == 12 for tokens in expected.values())


def test_prefill_side_holds_the_blocks_until_the_transfer_ends():
    prefill = make_engine(max_num_batched_tokens=48)
    free_before = prefill.kv_cache.pool.num_free_blocks
    handed = _prefill(prefill)
    held = sum(-(-len(prompt) // 16) for prompt in PROMPTS.values())
    assert prefill.kv_cache.pool.num_free_blocks == free_before - held
    for request_id in handed:
        prefill.release_prefilled(request_id)
    assert prefill.kv_cache.pool.num_free_blocks == free_before
    # An abort after the hand-off is the other way a transfer ends: it frees the blocks too.
    handed = _prefill(prefill)
    for request_id in handed:
        assert prefill.abort_request(request_id) is None
    assert prefill.kv_cache.pool.num_free_blocks == free_before


def test_a_first_token_that_ends_the_request_is_not_handed_off():
    prefill = make_engine()
    spec = prefill.validator.validate(make_request("one", PROMPTS["r1"], max_tokens=1))
    prefill.add_request(spec, hand_off=True)
    (output,) = prefill.step()
    assert output.finished and output.prefilled is None
    assert prefill.kv_cache.pool.num_free_blocks == prefill.kv_cache.num_blocks


def test_decode_side_registers_the_prompt_blocks_in_its_prefix_cache():
    prefill = make_engine(enable_prefix_caching=True)
    handed = _prefill(prefill)
    decode = make_engine(enable_prefix_caching=True)
    decode.add_prefilled(handed["r5"])
    _run(decode)
    prompt = PROMPTS["r5"]
    add_request(decode, make_request("again", prompt, max_tokens=2))
    decode.step()
    assert decode.scheduler.prefix_cache_hits == (len(prompt) - 1) // 16 * 16


def test_decode_side_preemption_recomputes_from_the_prompt_with_the_same_tokens():
    handed = _prefill(make_engine(max_num_batched_tokens=48), max_tokens=40)
    # Too few blocks for every request's growth: decodes preempt one another, and requests
    # arriving to a full pool queue to recompute their prompt.
    decode = make_engine(num_kv_blocks=30, max_num_batched_tokens=64)
    for prefilled in handed.values():
        decode.add_prefilled(prefilled)
    continued = _run(decode)
    assert decode.scheduler.num_preemptions > 0
    expected = _together(max_tokens=40)
    assert {rid: [handed[rid].first_token_id, *continued[rid]] for rid in handed} == expected
    assert decode.kv_cache.pool.num_free_blocks == decode.kv_cache.num_blocks


class _RecordingExecutor(SimulatedExecutor):
    """A simulated executor whose KV contents are the block ids read, as a transfer's stand-in."""

    def __init__(self) -> None:
        super().__init__(64, 16, 1000, kv_bytes_per_token=4096)
        self.written: list[tuple[list[int], object]] = []

    def read_kv(self, block_ids: Sequence[int]) -> object:
        return ("kv of", tuple(block_ids))

    def write_kv(self, block_ids: Sequence[int], contents: object) -> None:
        self.written.append((list(block_ids), contents))


def _engine_on(executor: SimulatedExecutor) -> Engine:
    reference = make_engine()
    return Engine(reference.config, executor, max_model_len=4096, vocab_size=1000, eos_token_ids=[])


def test_kv_contents_read_on_the_prefill_side_are_written_into_the_decode_side_blocks():
    prefill = _engine_on(_RecordingExecutor())
    decode_executor = _RecordingExecutor()
    decode = _engine_on(decode_executor)
    spec = prefill.validator.validate(make_request("r", PROMPTS["r2"], max_tokens=4))
    prefill.add_request(spec, hand_off=True)
    (output,) = prefill.step()
    prefilled = output.prefilled
    assert prefilled is not None and prefilled.num_kv_bytes == len(PROMPTS["r2"]) * 4096
    source_table = tuple(prefill.kv_cache.block_table("r"))
    contents = prefill.read_prefilled_kv("r")
    decode.add_prefilled(prefilled, contents)
    assert decode_executor.written == [(decode.kv_cache.block_table("r"), ("kv of", source_table))]
    assert len(source_table) == -(-len(PROMPTS["r2"]) // 16)


class _FailingWriteExecutor(_RecordingExecutor):
    def write_kv(self, block_ids: Sequence[int], contents: object) -> None:
        raise ValueError("KV contents do not fit")


def test_a_failed_kv_write_leaves_nothing_of_the_request_on_the_decode_side():
    prefill = _engine_on(_RecordingExecutor())
    decode = _engine_on(_FailingWriteExecutor())
    spec = prefill.validator.validate(make_request("r", PROMPTS["r2"], max_tokens=4))
    prefill.add_request(spec, hand_off=True)
    (output,) = prefill.step()
    assert output.prefilled is not None
    with pytest.raises(ValueError, match="do not fit"):
        decode.add_prefilled(output.prefilled, prefill.read_prefilled_kv("r"))
    assert not decode.has_unfinished_requests
    assert decode.kv_cache.pool.num_free_blocks == decode.kv_cache.num_blocks
    # The same id can come again: nothing of the failed one is held.
    decode.add_prefilled(output.prefilled)
    assert decode.has_unfinished_requests


def _text_engine(tokenizer: Tokenizer) -> Engine:
    vocab = tokenizer.backend.get_vocab_size()
    executor = SimulatedExecutor(256, 16, vocab)
    config = make_engine().config
    return Engine(
        config,
        executor,
        max_model_len=4096,
        vocab_size=vocab,
        eos_token_ids=[],
        tokenizer=tokenizer,
    )


def test_text_continues_across_the_seam_with_held_back_text_released_once():
    tokenizer = sentencepiece_style_tokenizer()
    prompt = tokenizer.encode("hello world")
    # A stop string that never matches still holds back its length less one character.
    spec = make_request("r", prompt, max_tokens=30, stop=["~~~"])
    alone = _text_engine(tokenizer)
    alone.add_request(alone.validator.validate(spec))
    expected = ""
    while alone.has_unfinished_requests:
        expected += "".join(output.new_text for output in alone.step())
    prefill, decode = _text_engine(tokenizer), _text_engine(tokenizer)
    prefill.add_request(prefill.validator.validate(spec), hand_off=True)
    (first,) = prefill.step()
    # The first token's text (one character here) is held back on the prefill side.
    assert first.prefilled is not None and first.new_text == ""
    decode.add_prefilled(first.prefilled)
    text = first.new_text
    while decode.has_unfinished_requests:
        text += "".join(output.new_text for output in decode.step())
    assert len(expected) > 10 and text == expected
