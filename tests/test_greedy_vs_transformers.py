"""The oracle for model code: Baton's greedy output equals transformers' greedy output for tiny
random checkpoints of every supported family; where they first differ, the reference's top two
logits must be a near tie."""

from __future__ import annotations

import random

import pytest
import torch

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams

NEAR_TIE = 1e-3
PROMPT_LENGTHS = (1, 7, 64, 300, 520)
NUM_NEW_TOKENS = 24


def random_prompts(vocab: int, lengths=PROMPT_LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids 0-2 are the special tokens of the test tokenizer.
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def transformers_greedy(model, prompt: list[int], num_new: int) -> list[int]:
    """Greedy decoding with transformers' own KV cache; EOS is just another token here, as
    with Baton's ignore_eos (transformers' min_new_tokens would mask it instead)."""
    generated: list[int] = []
    inputs = torch.tensor([prompt])
    past = None
    with torch.no_grad():
        for _ in range(num_new):
            out = model(inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            next_token = int(out.logits[0, -1].argmax())
            generated.append(next_token)
            inputs = torch.tensor([[next_token]])
    return generated


def assert_same_or_near_tie(model, prompt: list[int], ours: list[int], reference: list[int]):
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        if a != b:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + reference[:step]])).logits[0, -1]
            top2 = torch.topk(logits.float(), 2).values
            gap = (top2[0] - top2[1]).item()
            assert gap < NEAR_TIE, f"diverged at step {step} with a logit gap of {gap}"
            return


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("llama", {}),
        ("llama", {"num_key_value_heads": 1, "tie_word_embeddings": True}),
        ("mistral", {}),
        ("qwen2", {}),
        ("qwen3", {"head_dim": 32}),
    ],
    ids=["llama", "llama-mqa-tied", "mistral", "qwen2", "qwen3"],
)
def test_greedy_output_matches_transformers(make_checkpoint, family, overrides):
    import transformers

    path = make_checkpoint(family, **overrides)
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    reference_model.eval()
    llm = LLM(path, device="cpu", max_num_batched_tokens=128, num_kv_blocks=512)
    prompts = random_prompts(reference_model.config.vocab_size)
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    for prompt, result in zip(prompts, results, strict=True):
        reference = transformers_greedy(reference_model, prompt, NUM_NEW_TOKENS)
        assert len(result.token_ids) == NUM_NEW_TOKENS
        assert_same_or_near_tie(reference_model, prompt, result.token_ids, reference)


def test_logprobs_match_transformers_log_softmax(llama_checkpoint):
    import transformers

    reference_model = transformers.AutoModelForCausalLM.from_pretrained(
        llama_checkpoint, dtype=torch.float32
    )
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=64)
    prompt = random_prompts(512, lengths=(20,))[0]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=4)
    result = llm.generate([prompt], params)[0]
    assert len(result.logprobs) == 3
    with torch.no_grad():
        logits = reference_model(torch.tensor([prompt + result.token_ids[:2]])).logits[0]
    for step, entry in enumerate(result.logprobs):
        expected = torch.log_softmax(logits[len(prompt) - 1 + step].float(), -1)
        top = torch.topk(expected, 4)
        assert entry.token_id == result.token_ids[step] == int(top.indices[0])
        assert entry.logprob == pytest.approx(float(top.values[0]), abs=1e-4)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert [lp for _, lp in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)
