"""A draft model's drafts change no token: greedy output is the same with
`--speculative-method draft` as without, alone, batched, in prefill chunks, through preemption
and with a warm prefix cache; a seeded sampled request repeats itself. A draft model that is
the served model itself has every draft accepted, which only a complete draft KV in the shared
blocks gives. A draft model of another vocabulary is refused before anything loads."""

from __future__ import annotations

import itertools
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from baton.app.llm import LLM
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.speculative.draft_model import resolve_draft_model
from baton.core.structured_output import GuideKind, StructuredOutput
from baton.gpu.kv_cache import kv_cache_bytes_per_block
from tests.factory import add_request, make_engine, make_request
from tests.test_speculation import PROMPT, run
from tests.test_speculative_decoding import (
    NUM_REQUESTS,
    assert_drafts_accepted_and_rejected,
    token_ids,
    workload,
)

# Noise on the decoder layers' weights, in each tensor's standard deviations: the draft then
# agrees with the model about half the time, so runs see both verification outcomes.
DRAFT_NOISE = 0.05


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint):
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def draft_checkpoint(checkpoint, tmp_path_factory):
    """The model's checkpoint with noisy decoder layers: a random draft model of its
    vocabulary whose greedy tokens are often, not always, the model's."""
    out = tmp_path_factory.mktemp("draft")
    shutil.copytree(checkpoint, out, dirs_exist_ok=True)
    weights = load_file(out / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in weights.items():
        if name.startswith("model.layers."):
            noise = torch.randn(tensor.shape, generator=generator)
            weights[name] = tensor + DRAFT_NOISE * tensor.std() * noise
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def plain(checkpoint):
    prompts, params = workload(512)
    llm = LLM(checkpoint, device="cpu", max_num_batched_tokens=256, num_kv_blocks=1024)
    return token_ids(llm.generate(prompts, params))


def drafting(checkpoint, draft, **config) -> LLM:
    """An engine whose draft model proposes wherever the planner may: it prices steps as a
    memory-bound machine's, so the measured step times of a busy machine do not decide how
    many drafts the test exercises."""
    llm = LLM(
        checkpoint,
        device="cpu",
        speculative_method="draft",
        speculative_model=str(draft),
        num_speculative_tokens=4,
        **config,
    )
    llm.engine.speculator.cost = CostCoefficients(base_s=1.0, per_prefill_token_s=0.0)
    return llm


def test_greedy_output_is_the_same_with_a_draft_model_in_chunks_and_a_warm_prefix_cache(
    checkpoint, draft_checkpoint, plain
):
    prompts, params = workload(512)
    # Prompts of up to 240 tokens in chunks of 16: the draft model's KV grows chunk by chunk.
    llm = drafting(checkpoint, draft_checkpoint, max_num_batched_tokens=16, num_kv_blocks=1024)
    cold = token_ids(llm.generate(prompts, params))
    assert_drafts_accepted_and_rejected(llm)
    hits_before = llm.engine.scheduler.prefix_cache_hits
    warm = token_ids(llm.generate(prompts, params))
    assert llm.engine.scheduler.prefix_cache_hits - hits_before > sum(map(len, prompts)) // 2
    assert cold == plain
    assert warm == plain


def test_greedy_output_is_the_same_with_a_draft_model_alone_and_through_preemption(
    checkpoint, draft_checkpoint, plain
):
    prompts, params = workload(512)
    alone = drafting(checkpoint, draft_checkpoint, num_kv_blocks=64)
    for i in (0, 5, 11):
        assert alone.generate([prompts[i]], params[i])[0].token_ids == plain[i]
    assert_drafts_accepted_and_rejected(alone)
    crowded = drafting(checkpoint, draft_checkpoint, max_num_batched_tokens=256, num_kv_blocks=40)
    assert token_ids(crowded.generate(prompts, params)) == plain
    assert crowded.engine.scheduler.num_preemptions > 0
    assert crowded.engine.kv_cache.pool.num_free_blocks == 40


def test_a_draft_model_that_is_the_model_has_every_draft_accepted(checkpoint, plain):
    # Its drafts are the model's own greedy tokens wherever its KV matches the model's: in
    # chunks, after preemption and from prefix-cached blocks it did not compute itself.
    prompts, params = workload(512)
    llm = drafting(checkpoint, checkpoint, max_num_batched_tokens=32, num_kv_blocks=48)
    assert token_ids(llm.generate(prompts, params)) == plain
    assert token_ids(llm.generate(prompts, params)) == plain
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.scheduler.prefix_cache_hits > 0
    stats = llm.engine.make_stats().spec_decode
    assert stats.num_draft_tokens > 300
    assert stats.acceptance_rate > 0.99


def test_a_decode_that_drafts_again_catches_the_draft_kv_up(checkpoint, plain):
    # The planner gives drafts on every third step only: the draft model skips the decodes
    # of the others, and must compute their keys and values before it next proposes.
    prompts, params = workload(512)
    llm = drafting(checkpoint, checkpoint, num_kv_blocks=1024)
    speculator = llm.engine.speculator
    planned = speculator.drafts_beside
    steps = itertools.count()

    def every_third_step(decodes, prefilling, token_budget):
        drafts = planned(decodes, prefilling, token_budget)
        return drafts if next(steps) % 3 == 0 else [[] for _ in decodes]

    speculator.drafts_beside = every_third_step
    assert token_ids(llm.generate(prompts, params)) == plain
    stats = llm.engine.make_stats().spec_decode
    assert stats.num_draft_tokens > 100
    assert stats.acceptance_rate > 0.99


def test_logprobs_penalties_and_a_grammar_hold_with_a_draft_model(checkpoint, draft_checkpoint):
    # The draft model proposes its own argmax, blind to penalties, bias and grammar: the model's
    # verification must still give each request exactly its plain tokens and logprobs.
    prompts, _ = workload(512)
    penalised = SamplingParams(
        max_tokens=40,
        temperature=0.0,
        ignore_eos=True,
        logprobs=2,
        repetition_penalty=1.3,
        logit_bias={7: 3.0, 9: -100.0},
    )
    regex = StructuredOutput(GuideKind.REGEX, "(ab|abc|bca)+ end")
    constrained = SamplingParams(temperature=0.0, max_tokens=48, structured_output=regex)
    params = [penalised, penalised, constrained]
    reference = LLM(checkpoint, device="cpu", num_kv_blocks=256).generate(prompts[:3], params)
    llm = drafting(checkpoint, draft_checkpoint, num_kv_blocks=256)
    results = llm.generate(prompts[:3], params)
    assert_drafts_accepted_and_rejected(llm)
    assert results[2].text.endswith(" end")
    for got, want in zip(results, reference, strict=True):
        assert got.token_ids == want.token_ids
        for got_lp, want_lp in zip(got.logprobs, want.logprobs, strict=True):
            assert got_lp.logprob == pytest.approx(want_lp.logprob, abs=1e-4)


def test_seeded_sampling_gives_the_same_tokens_with_a_draft_model(checkpoint, draft_checkpoint):
    prompts, _ = workload(512)
    params = [
        SamplingParams(max_tokens=32, temperature=0.3, seed=10 + i, ignore_eos=True)
        for i in range(NUM_REQUESTS)
    ]
    plain_llm = LLM(checkpoint, device="cpu", num_kv_blocks=1024)
    llm = drafting(checkpoint, draft_checkpoint, num_kv_blocks=1024)
    batched = token_ids(llm.generate(prompts, params))
    assert batched == token_ids(plain_llm.generate(prompts, params))
    assert llm.generate([prompts[3]], params[3])[0].token_ids == batched[3]
    assert_drafts_accepted_and_rejected(llm)


def test_the_cache_holds_both_models_keys_and_values_in_each_block(checkpoint, draft_checkpoint):
    budget = 1024 * 1024
    llm = drafting(checkpoint, draft_checkpoint, kv_cache_memory_bytes=budget)
    executor = llm.engine.executor
    model, draft = (ModelConfig.from_pretrained(path) for path in (checkpoint, draft_checkpoint))
    per_block = sum(kv_cache_bytes_per_block(c, 16, torch.float32) for c in (model, draft))
    assert executor.num_kv_blocks == budget // per_block
    assert all(cache.shape[1] == executor.num_kv_blocks for cache in executor.draft.kv_caches)


def test_a_draft_model_of_another_vocabulary_is_refused(checkpoint, make_checkpoint, tmp_path):
    model = ModelConfig.from_pretrained(checkpoint)
    wider = make_checkpoint("llama", vocab_size=640)
    with pytest.raises(ValueError, match=r"vocabulary of 640 tokens .* one of 512"):
        resolve_draft_model(wider, model, model.max_model_len)
    # The same size, but two tokens numbered the other way round.
    shutil.copytree(checkpoint, tmp_path, dirs_exist_ok=True)
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = (token for token, token_id in vocab.items() if token_id in (300, 301))
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match=r"another tokenizer .* is id 300 in the model's"):
        resolve_draft_model(tmp_path, model, model.max_model_len)
    with pytest.raises(ValueError, match=r"--speculative-model .* is not a folder"):
        resolve_draft_model(tmp_path / "absent", model, model.max_model_len)
    with pytest.raises(ValueError, match="needs --speculative-model DIR"):
        LLM(checkpoint, device="cpu", speculative_method="draft")
    with pytest.raises(ValueError, match="add --speculative-method draft"):
        LLM(checkpoint, device="cpu", speculative_model=str(checkpoint))


def test_the_simulator_accepts_a_draft_models_placeholders_at_the_workload_rate():
    engine = make_engine(draft_acceptance=0.5, speculative_method="draft", num_speculative_tokens=4)
    add_request(engine, make_request("r", PROMPT, max_tokens=40))
    engine.executor.script_answer("r", None)
    outputs = run(engine)
    spec = engine.make_stats().spec_decode
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    assert sum(len(output.new_token_ids) for output in outputs["r"]) == 40


def test_a_request_prefilled_elsewhere_drafts_from_the_moved_draft_kv(checkpoint, plain):
    # The prefill side's draft KV of the prompt moves with the model's: with the model as its
    # own draft, the decoding side then has every draft accepted from its first step.
    prompts, params = workload(512)
    prefill = drafting(checkpoint, checkpoint, num_kv_blocks=256)
    decode = drafting(checkpoint, checkpoint, num_kv_blocks=256)
    handed = []
    for i in range(3):
        spec = prefill.engine.validator.validate(
            make_request(
                f"r{i}",
                prompts[i],
                max_tokens=params[i].max_tokens,
                temperature=0.0,
                ignore_eos=True,
            )
        )
        prefill.engine.add_request(spec, hand_off=True)
    while prefill.engine.has_unfinished_requests:
        handed += [o.prefilled for o in prefill.engine.step() if o.prefilled is not None]
    tokens = {}
    for prefilled in handed:
        kv = prefill.engine.read_prefilled_kv(prefilled.request_id)
        prefill.engine.release_prefilled(prefilled.request_id)
        decode.engine.add_prefilled(prefilled, kv)
        tokens[prefilled.request_id] = [prefilled.first_token_id]
    while decode.engine.has_unfinished_requests:
        for output in decode.engine.step():
            tokens[output.request_id] += output.new_token_ids
    assert [tokens[f"r{i}"] for i in range(3)] == plain[:3]
    stats = decode.engine.make_stats().spec_decode
    assert stats.num_draft_tokens > 30
    assert stats.acceptance_rate > 0.99
    assert prefill.engine.kv_cache.pool.num_free_blocks == 256
