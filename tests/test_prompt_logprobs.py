"""Prompt log-probabilities (`echo` with `logprobs`, `prompt_logprobs`, `max_tokens: 0`): equal to
transformers' log-softmax over the prompt, alone, batched and with prefill chunks smaller than
the prompt; collected once across chunking, prefix-cache hits and preemption; and only the
requests that ask pay for them."""

from __future__ import annotations

import random

import pytest
import torch

from baton.app.llm import LLM
from baton.core.batch import Batch, ScheduledSequence
from baton.core.request import FinishReason
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.core.simulation.simulated_executor import SimulatedExecutor
from tests.factory import add_request, make_engine, make_request

TOP = 3


def prompts(vocab: int, lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def reference_prompt_logprobs(model, prompt: list[int]) -> torch.Tensor:
    """transformers' float32 log-softmax at every prompt position: row p scores token p + 1."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def assert_matches_reference(entries, prompt: list[int], reference: torch.Tensor) -> None:
    assert len(entries) == len(prompt)
    assert entries[0] is None
    for position, entry in enumerate(entries[1:]):
        expected = reference[position]
        assert entry.token_id == prompt[position + 1]
        assert entry.logprob == pytest.approx(float(expected[prompt[position + 1]]), abs=1e-4)
        top = torch.topk(expected, TOP)
        assert [lp for _, lp in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)


@pytest.fixture(scope="module")
def reference_model(llama_checkpoint):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.float32)


SCORED = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=TOP)


def test_prompt_logprobs_equal_transformers_alone(llama_checkpoint, reference_model):
    prompt = prompts(512, (40,))[0]
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=64)
    result = llm.generate([prompt], SCORED)[0]
    reference = reference_prompt_logprobs(reference_model, prompt)
    assert_matches_reference(result.prompt_logprobs, prompt, reference)
    assert len(result.token_ids) == 2


def test_prompt_logprobs_equal_transformers_batched_and_in_small_chunks(
    llama_checkpoint, reference_model
):
    scored = prompts(512, (70, 33), seed=1)
    others = prompts(512, (50, 20, 90), seed=2)
    plain = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    # Chunks of 16 tokens split every scored prompt over several steps, beside the others'
    # prefills and decodes; the cache is warm with the first scored prompt, which must not be
    # read back for positions still to score.
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=128, max_num_batched_tokens=16)
    llm.generate([scored[0]], plain)
    results = llm.generate(
        [others[0], scored[0], others[1], scored[1], others[2]],
        [plain, SCORED, plain, SCORED, plain],
    )
    for result, prompt in ((results[1], scored[0]), (results[3], scored[1])):
        assert_matches_reference(
            result.prompt_logprobs, prompt, reference_prompt_logprobs(reference_model, prompt)
        )
    assert all(results[i].prompt_logprobs is None for i in (0, 2, 4))


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(llama_checkpoint, reference_model):
    prompt = prompts(512, (25,), seed=3)[0]
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=64)
    params = SamplingParams(max_tokens=0, prompt_logprobs=TOP)
    result = llm.generate([prompt], params)[0]
    assert result.token_ids == []
    assert result.text == ""
    assert result.finish_reason is FinishReason.LENGTH
    assert_matches_reference(
        result.prompt_logprobs, prompt, reference_prompt_logprobs(reference_model, prompt)
    )


def test_only_requests_that_ask_get_prompt_positions_scheduled():
    batches: list[Batch] = []
    engine = make_engine(max_num_batched_tokens=20, on_batch=batches.append)
    add_request(engine, make_request("plain", list(range(3, 40)), max_tokens=2))
    add_request(engine, make_request("scored", list(range(3, 40)), max_tokens=2, prompt_logprobs=0))
    while engine.has_unfinished_requests:
        engine.step()
    positions = {"plain": [], "scored": []}
    for batch in batches:
        for seq in batch.sequences:
            positions[seq.request_id].extend(seq.prompt_logprob_positions)
    assert positions["plain"] == []
    # Position p scores prompt token p + 1; the last prompt position samples the first output.
    assert positions["scored"] == list(range(0, 36))


def collect_scored(engine, prompt: list[int], **sampling) -> list:
    add_request(engine, make_request("scored", prompt, prompt_logprobs=0, **sampling))
    scored = None
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.request_id == "scored" and output.prompt_logprobs is not None:
                assert scored is None, "prompt logprobs are delivered once"
                scored = output.prompt_logprobs
    return scored


def expected_simulated(prompt: list[int]) -> list:
    """What the simulated executor scores `prompt` with, computed in one pass."""
    seq = ScheduledSequence(
        "x", prompt, 0, [], False, SamplingParams(), prompt, len(prompt), range(len(prompt) - 1)
    )
    return [None, *SimulatedExecutor.prompt_logprobs(seq)]


def test_prompt_logprobs_are_collected_once_across_chunks_and_preemption():
    prompt = list(range(5, 69))
    expected = expected_simulated(prompt)
    assert collect_scored(make_engine(max_num_batched_tokens=7), prompt, max_tokens=3) == expected
    # A pool of 6 blocks of 16 tokens cannot hold the scored prompt beside a long-running
    # request, so one of them is preempted mid-prefill and computed again.
    engine = make_engine(num_kv_blocks=6, max_num_batched_tokens=24)
    add_request(engine, make_request("other", list(range(3, 40)), max_tokens=40))
    engine.step()
    assert collect_scored(engine, prompt, max_tokens=3) == expected
    assert engine.scheduler.num_preemptions > 0


def test_a_prefix_cache_hit_is_read_only_before_positions_still_to_score():
    prompt = list(range(5, 69))
    engine = make_engine(max_num_batched_tokens=256)
    add_request(engine, make_request("warm", prompt, max_tokens=1))
    while engine.has_unfinished_requests:
        engine.step()
    hits = engine.scheduler.prefix_cache_hits
    assert collect_scored(engine, prompt, max_tokens=1) == expected_simulated(prompt)
    assert engine.scheduler.prefix_cache_hits == hits
    add_request(engine, make_request("again", prompt, max_tokens=1))
    while engine.has_unfinished_requests:
        engine.step()
    assert engine.scheduler.prefix_cache_hits > hits


def test_max_tokens_zero_finishes_after_prefill_without_a_token():
    engine = make_engine(max_num_batched_tokens=8)
    add_request(engine, make_request("score", list(range(3, 30)), max_tokens=0))
    outputs = []
    while engine.has_unfinished_requests:
        outputs.extend(engine.step())
    (final,) = outputs
    assert final.finished and final.finish_reason is FinishReason.LENGTH
    assert final.new_token_ids == [] and final.num_output_tokens == 0
    assert final.timing is not None and final.timing.ttft_ms > 0


def test_negative_max_tokens_and_prompt_logprobs_out_of_range_are_refused():
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams(max_tokens=-1)
    with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)


def test_a_scored_request_keeps_its_prompt_logprobs_when_a_batch_mate_faults():
    def fault(batch: Batch) -> None:
        if any(seq.all_token_ids[0] == 99 for seq in batch.sequences):
            raise RuntimeError("injected fault")

    engine = make_engine(on_batch=fault)
    add_request(engine, make_request("faulty", [99, 5, 6], max_tokens=2))
    prompt = list(range(5, 40))
    assert collect_scored(engine, prompt, max_tokens=2) == expected_simulated(prompt)
