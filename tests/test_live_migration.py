"""A running decode moved to another engine mid-stream (`Engine.migrate`): the same tokens, log
probabilities and text as on one engine, greedy and seeded-sampled, with penalties and a stop
string that spans the seam; the blocks freed on both sides; and the requests that cannot move
refused."""

from __future__ import annotations

import pytest

from baton.app.llm import LLM
from baton.core.engine import Engine
from baton.core.outputs import RequestOutput
from baton.core.prefilled import PrefilledRequest
from baton.core.request import SLO, EngineRequest
from baton.core.simulation.simulated_executor import SimulatedExecutor
from baton.core.text.tokenizer import Tokenizer
from tests.factory import make_engine, make_request
from tests.test_detokenizer import sentencepiece_style_tokenizer

PROMPTS = {f"r{i}": [(11 * i + j) % 997 + 1 for j in range(9 + 23 * i)] for i in range(4)}


def _submit(engine: Engine, spec: EngineRequest) -> None:
    engine.add_request(engine.validator.validate(spec))


def _step_until_handed_off(
    engine: Engine, request_id: str, after_tokens: int, outputs: list[RequestOutput]
) -> PrefilledRequest:
    """Step `engine` (collecting every output) until `request_id` has `after_tokens` tokens,
    ask for its migration, and step on until it is handed off."""
    asked = False
    # Bounded: a migration that never happens fails here instead of stepping for ever.
    for _ in range(1000):
        assert engine.has_unfinished_requests, f"{request_id} finished without being handed off"
        step = engine.step()
        outputs.extend(step)
        handed = [output.prefilled for output in step if output.prefilled is not None]
        if handed:
            assert [prefilled.request_id for prefilled in handed] == [request_id]
            return handed[0]
        produced = sum(len(o.new_token_ids) for o in outputs if o.request_id == request_id)
        if not asked and produced >= after_tokens:
            assert engine.migrate(request_id)
            asked = True
    raise AssertionError(f"{request_id} was not handed off within 1000 steps")


def _run(engine: Engine, outputs: list[RequestOutput]) -> None:
    while engine.has_unfinished_requests:
        outputs.extend(engine.step())


def _tokens(outputs: list[RequestOutput]) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for output in outputs:
        tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    return tokens


def _logprobs(outputs: list[RequestOutput], request_ids) -> dict[str, list]:
    return {
        rid: [lp for o in outputs if o.request_id == rid for lp in o.logprobs or []]
        for rid in request_ids
    }


def _move(source: Engine, target: Engine, prefilled: PrefilledRequest) -> None:
    """The transfer, as a replica does it: read the KV, free the source's blocks, write it."""
    kv = source.read_prefilled_kv(prefilled.request_id)
    source.release_prefilled(prefilled.request_id)
    target.add_prefilled(prefilled, kv)


def test_a_decode_migrated_mid_stream_gives_the_same_tokens_and_frees_both_sides():
    specs = [make_request(rid, prompt, max_tokens=30) for rid, prompt in PROMPTS.items()]
    alone = make_engine(max_num_batched_tokens=64)
    expected: list[RequestOutput] = []
    for spec in specs:
        _submit(alone, spec)
    _run(alone, expected)

    source = make_engine(max_num_batched_tokens=64)
    prefill_tokens: list[int] = []
    target = make_engine(on_batch=lambda batch: prefill_tokens.append(batch.num_prefill_tokens))
    outputs: list[RequestOutput] = []
    for spec in specs:
        _submit(source, spec)
    prefilled = _step_until_handed_off(source, "r2", 11, outputs)
    assert prefilled.migrated and len(prefilled.output_token_ids) == 12
    assert prefilled.num_kv_bytes == 0 and len(prefilled.token_times) == 12
    _move(source, target, prefilled)
    _run(source, outputs)
    _run(target, outputs)
    assert _tokens(outputs) == _tokens(expected)
    # It decodes on from the moved KV: nothing is computed again on the target.
    assert prefill_tokens and not any(prefill_tokens)
    for engine in (source, target):
        assert engine.kv_cache.pool.num_free_blocks == engine.kv_cache.num_blocks
    (final,) = [o for o in outputs if o.request_id == "r2" and o.finished]
    assert len(final.token_times) == 30 and final.timing.ttft_ms > 0


def test_a_request_that_finishes_before_it_moves_is_simply_done():
    engine = make_engine()
    _submit(engine, make_request("r", PROMPTS["r1"], max_tokens=3))
    outputs: list[RequestOutput] = []
    while len(_tokens(outputs).get("r", [])) < 2:
        outputs.extend(engine.step())
    # Asked to move at its next token, which is its last.
    assert engine.migrate("r")
    outputs.extend(engine.step())
    assert outputs[-1].finished and all(o.prefilled is None for o in outputs)
    assert engine.kv_cache.pool.num_free_blocks == engine.kv_cache.num_blocks
    assert not engine.migrate("r")


def test_requests_before_their_first_token_or_with_drafts_are_not_migrated():
    engine = make_engine()
    _submit(engine, make_request("waiting", PROMPTS["r3"], max_tokens=5))
    assert not engine.migrate("waiting")
    assert not engine.migrate("unknown")
    engine.step()
    assert engine.migrate("waiting")
    # Under speculative decoding a move would have to carry the draft state: refused.
    drafting = make_engine(speculative_method="ngram")
    _submit(drafting, make_request("drafted", PROMPTS["r3"], max_tokens=5))
    drafting.step()
    assert not drafting.migrate("drafted")


def _text_engine(tokenizer: Tokenizer) -> Engine:
    vocab = tokenizer.backend.get_vocab_size()
    return Engine(
        make_engine().config,
        SimulatedExecutor(256, 16, vocab),
        max_model_len=4096,
        vocab_size=vocab,
        eos_token_ids=[],
        tokenizer=tokenizer,
    )


def _text(outputs: list[RequestOutput]) -> str:
    return "".join(output.new_text for output in outputs)


def test_a_stop_string_spanning_the_seam_stops_the_migrated_request_as_on_one_engine():
    tokenizer = sentencepiece_style_tokenizer()
    prompt = tokenizer.encode("hello world")
    free_run: list[RequestOutput] = []
    engine = _text_engine(tokenizer)
    _submit(engine, make_request("r", prompt, max_tokens=40))
    _run(engine, free_run)
    seam_tokens = 12
    seam = len(tokenizer.decode([t for o in free_run for t in o.new_token_ids][:seam_tokens]))
    full = _text(free_run)
    # A stop string that starts before the seam and ends after it, found nowhere earlier.
    start = next(i for i in range(seam - 3, 0, -1) if full.find(full[i : seam + 3]) == i)
    stop = full[start : seam + 3]
    spec = make_request("r", prompt, max_tokens=40, stop=[stop])

    expected: list[RequestOutput] = []
    alone = _text_engine(tokenizer)
    _submit(alone, spec)
    _run(alone, expected)
    source, target = _text_engine(tokenizer), _text_engine(tokenizer)
    _submit(source, spec)
    outputs: list[RequestOutput] = []
    prefilled = _step_until_handed_off(source, "r", seam_tokens - 1, outputs)
    before_seam = _text(outputs)
    target.add_prefilled(prefilled)
    source.release_prefilled("r")
    _run(target, outputs)
    # The stop string's first part was held back at the seam, and never sent.
    assert full.startswith(before_seam) and len(before_seam) <= start
    assert _text(expected) == full[:start]
    assert _text(outputs) == _text(expected)
    assert outputs[-1].finish_reason == expected[-1].finish_reason
    assert _tokens(outputs) == _tokens(expected)


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint):
    return make_checkpoint("llama")


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.0, "logprobs": 2},
        {"temperature": 0.9, "top_k": 50, "seed": 7, "repetition_penalty": 1.3, "logprobs": 2},
    ],
    ids=["greedy", "seeded"],
)
def test_a_real_model_migrated_mid_decode_continues_token_for_token(checkpoint, sampling):
    prompts = {rid: [t % 500 + 3 for t in prompt] for rid, prompt in PROMPTS.items()}
    specs = [
        make_request(rid, prompt, max_tokens=16, ignore_eos=True, **sampling)
        for rid, prompt in prompts.items()
    ]
    engines = [
        LLM(checkpoint, device="cpu", num_kv_blocks=64, max_num_batched_tokens=32).engine
        for _ in range(2)
    ]
    alone, source = engines
    expected: list[RequestOutput] = []
    for spec in specs:
        _submit(alone, spec)
    _run(alone, expected)
    _, target = engines  # the reference engine, idle again, receives the move
    outputs: list[RequestOutput] = []
    for spec in specs:
        _submit(source, spec)
    prefilled = _step_until_handed_off(source, "r1", 6, outputs)
    _move(source, target, prefilled)
    _run(source, outputs)
    _run(target, outputs)
    assert _tokens(outputs) == _tokens(expected)
    logprobs = [_logprobs(run, prompts) for run in (outputs, expected)]
    assert logprobs[0] == logprobs[1]
    assert all(len(lp) == 16 for lp in logprobs[0].values())
    for engine in engines:
        assert engine.kv_cache.pool.num_free_blocks == engine.kv_cache.num_blocks


def test_a_migrated_decode_is_paced_from_its_landing():
    slo = SLO(ttft_ms=1000, tpot_ms=50)
    source, target = make_engine(), make_engine()
    _submit(source, make_request("r", PROMPTS["r1"], max_tokens=30, slo=slo))
    prefilled = _step_until_handed_off(source, "r", 9, [])
    request = target.add_prefilled(prefilled)
    now = target.clock()
    # Its next token is due one target after it lands, not ten (the tokens it brought).
    assert target.scheduler.policy.tpot_allowance_s(request, now) == pytest.approx(0.05)
