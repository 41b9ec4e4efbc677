"""Baton's verdict on every causal LM type the installed transformers knows: "exact" (greedy
output equal to transformers' own in every scenario) or "refused: <reason>" at load, with the
reason a `RefusalReason` value. "wrong: <scenario>" and "crashed: <error>" are the verdicts the
sweep exists to keep at zero; "unbuilt: <error>" says transformers could not build, or run
its own forward over, the tiny checkpoint (tiny_causal_lm.OVERRIDES needs a line).

    python -m baton.tools.causal_lm_sweep [TYPE ...]   (benchmarks/causal_lm_sweep.py: markdown)
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from baton.tools.tiny_causal_lm import write_tiny_checkpoint

NUM_NEW_TOKENS = 8
# Where Baton's tokens first part from transformers', the reference's top two logits must be
# this close (the project's oracle rule: float rounding may flip a near tie, nothing else).
NEAR_TIE = 1e-3
CHUNK = 16
LONG_PROMPT = 200
# The scenarios a type must pass to be exact: one request alone; 8 of different lengths at
# once; a long prompt prefilled in CHUNK-token chunks after another that warmed its prefix.
ALONE, BATCH, CHUNKED = "alone", "8 at once", "chunked with a warm prefix cache"
SCENARIOS = (ALONE, BATCH, CHUNKED)
# Types whose cached decoding in transformers disagrees with its own forward over the whole
# sequence: the oracle is then that forward, recomputed per token.
RECOMPUTED_REFERENCE = frozenset({"dory"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """One type's outcome: `kind` is exact, refused, wrong or crashed; `detail` the reason,
    scenario or error."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind

    @property
    def label(self) -> str:
        """What the sweep's table shows: the reason of a refusal, the kind of anything else."""
        return str(self) if self.kind == "refused" else self.kind


def causal_lm_types() -> list[str]:
    """Every model type with a causal LM class in the installed transformers."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def scenario_prompts(seed: int = 0) -> dict[str, list[list[int]]]:
    """Token ids (3..511: the test tokenizer's ordinary tokens) for each scenario; CHUNKED's
    first prompt shares all but the last 40 tokens of its second."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 512) for _ in range(n)]

    long_prompt = tokens(LONG_PROMPT)
    return {
        ALONE: [tokens(12)],
        BATCH: [tokens(3 + 5 * i) for i in range(8)],
        CHUNKED: [long_prompt[:-40] + tokens(40), long_prompt],
    }


def sweep_verdict(
    model_type: str, tokenizer, scenarios: Sequence[str] = SCENARIOS, workdir: Path | None = None
) -> Verdict:
    """Build `model_type`'s tiny checkpoint, load it as `baton serve` would and judge it."""
    with tempfile.TemporaryDirectory(dir=workdir, prefix=f"sweep-{model_type}-") as folder:
        try:
            reference = write_tiny_checkpoint(model_type, Path(folder), tokenizer)
        except Exception as error:
            return Verdict("unbuilt", f"{type(error).__name__}: {error}")
        return judge(Path(folder), reference, scenarios, model_type in RECOMPUTED_REFERENCE)


def judge(
    folder: Path, reference, scenarios: Sequence[str] = SCENARIOS, recompute: bool = False
) -> Verdict:
    """Load `folder` in Baton and compare its greedy output with `reference`'s (the same
    weights, in transformers) in each scenario; `recompute`: without transformers' cache."""
    from baton.app.llm import LLM
    from baton.core.sampling_params import SamplingParams

    try:
        llm = LLM(
            folder,
            device="cpu",
            max_model_len=256,
            max_num_batched_tokens=CHUNK,
            num_kv_blocks=96,
            block_size=16,
        )
    except ValueError as error:  # UnsupportedModelError and CheckpointFormatError say why
        reason = getattr(error, "reason", None)
        if reason is None:
            return Verdict("crashed", f"{type(error).__name__}: {error}")
        return Verdict("refused", reason.value)
    except Exception as error:
        return Verdict("crashed", f"{type(error).__name__}: {error}")
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = scenario_prompts()
    for scenario in scenarios:
        try:
            if scenario == CHUNKED:  # the first warms the cache, the second reuses its blocks
                results = [llm.generate([prompt], params)[0] for prompt in prompts[scenario]]
            else:
                results = llm.generate(prompts[scenario], params)
        except Exception as error:
            return Verdict("crashed", f"{scenario}: {type(error).__name__}: {error}")
        for prompt, result in zip(prompts[scenario], results, strict=True):
            if result.error is not None:  # a failed forward fails its requests, not the engine
                return Verdict("crashed", f"{scenario}: {result.error}")
            try:
                expected = transformers_greedy(reference, prompt, NUM_NEW_TOKENS, recompute)
            except Exception as error:  # transformers cannot run its own tiny checkpoint
                return Verdict("unbuilt", f"transformers' forward: {type(error).__name__}: {error}")
            if not _same_or_near_tie(reference, prompt, result.token_ids, expected):
                return Verdict("wrong", scenario)
    return Verdict("exact")


def transformers_greedy(
    model, prompt: list[int], num_new: int, recompute: bool = False
) -> list[int]:
    """Greedy decoding with transformers' own cache (`recompute`: a forward over the whole
    sequence per token), EOS being just another token."""
    import torch

    generated: list[int] = []
    inputs, past = torch.tensor([prompt]), None
    with torch.no_grad():
        for _ in range(num_new):
            if recompute:
                out = model(torch.tensor([prompt + generated]), use_cache=False)
            else:
                out = model(inputs, past_key_values=past, use_cache=True)
                past = out.past_key_values
            generated.append(int(out.logits[0, -1].argmax()))
            inputs = torch.tensor([[generated[-1]]])
    return generated


def _same_or_near_tie(model, prompt: list[int], ours: list[int], expected: list[int]) -> bool:
    import torch

    if len(ours) != len(expected):
        return False
    parted = next((i for i, (a, b) in enumerate(zip(ours, expected, strict=True)) if a != b), None)
    if parted is None:
        return True
    with torch.no_grad():
        logits = model(torch.tensor([prompt + expected[:parted]]), use_cache=False).logits[0, -1]
    first, second = torch.topk(logits.float(), 2).values.tolist()
    return first - second < NEAR_TIE


def run_sweep(
    model_types: Sequence[str], on_verdict: Callable[[str, Verdict], None] | None = None
) -> dict[str, Verdict]:
    """Every type's verdict, with the tests' tokenizer; `on_verdict` sees each as it comes."""
    import logging

    from baton.tools.tokenizer_trainer import train_tokenizer

    logging.disable(logging.WARNING)  # transformers' and Baton's load-time notes, per type
    tokenizer = train_tokenizer(512)
    verdicts = {}
    with one_torch_thread():
        for model_type in model_types:
            verdicts[model_type] = sweep_verdict(model_type, tokenizer)
            if on_verdict is not None:
                on_verdict(model_type, verdicts[model_type])
    return verdicts


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run tiny models on one thread: a second one only waits for work it cannot get (and
    spins for it, costing CPU that a busy machine's neighbours need)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", help="model types (default: all)")
    args = parser.parse_args(argv)
    run_sweep(args.types or causal_lm_types(), lambda t, v: print(f"{t}: {v}", flush=True))


if __name__ == "__main__":
    main()
