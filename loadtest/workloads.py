"""Workload definitions for the load tests: prompt and output-length distributions drawn with a
fixed seed, shared or randomized system-prompt prefixes, and the user-count profiles behind the
load shapes (constant, step ramp, spike).

Prompt lengths are counted in words, which most BPE tokenizers map to about one token each; the
server's `usage.prompt_tokens` is the exact figure.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

# Common English words: each is one token in most vocabularies, so word count ≈ token count.
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there one all we their can has more when will would who "
    "so if out no time about up them some could what into only other then its two first than "
    "new like these any may people do after also most made over did many such where years way"
)
WORDS = tuple(_WORD_TEXT.split())

QUESTIONS = (
    "Summarize the text above in three sentences.",
    "What is the main point of the passage?",
    "List the key facts mentioned above.",
    "Write a short answer to the question in the context.",
)


@dataclass(frozen=True, slots=True)
class Workload:
    """Log-normal prompt and output lengths (median, spread as sigma of the log), clipped."""

    name: str
    prompt_median: int
    prompt_sigma: float
    output_median: int
    output_sigma: float
    max_prompt: int
    max_output: int


WORKLOADS: dict[str, Workload] = {
    "chat": Workload("chat", 64, 0.6, 128, 0.6, 512, 512),
    "rag": Workload("rag", 1536, 0.3, 128, 0.5, 4096, 512),
    "long-generation": Workload("long-generation", 64, 0.5, 1024, 0.3, 512, 2048),
}
# "mixed" draws one of the above per request with these weights.
MIXED_WEIGHTS = {"chat": 0.7, "rag": 0.2, "long-generation": 0.1}
WORKLOAD_NAMES = (*WORKLOADS, "mixed")
PREFIX_MODES = ("none", "shared", "random")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: chat messages and the output length to ask for."""

    messages: list[dict[str, str]]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What the command line chose; 0 for a length means "draw it from the workload"."""

    workload: str = "chat"
    prompt_tokens: int = 0
    max_tokens: int = 0
    prefix: str = "none"
    prefix_tokens: int = 256
    seed: int = 0


class RequestSampler:
    """Draws request specs for one user; users with different indexes get different but
    reproducible streams of requests."""

    def __init__(self, config: WorkloadConfig, user_index: int) -> None:
        self.config = config
        self.rng = random.Random(config.seed * 1_000_003 + user_index)
        # The shared prefix depends on the seed alone, so every user sends the same one and the
        # server's prefix cache can serve it.
        self.shared_prefix = words(random.Random(config.seed), config.prefix_tokens)

    def sample(self) -> RequestSpec:
        workload = self._pick_workload()
        prompt_len = self.config.prompt_tokens or self._draw(
            workload.prompt_median, workload.prompt_sigma, workload.max_prompt
        )
        max_tokens = self.config.max_tokens or self._draw(
            workload.output_median, workload.output_sigma, workload.max_output
        )
        messages = self._system_messages()
        question = self.rng.choice(QUESTIONS)
        messages.append({"role": "user", "content": f"{words(self.rng, prompt_len)}\n{question}"})
        return RequestSpec(messages, max_tokens)

    def _pick_workload(self) -> Workload:
        if self.config.workload != "mixed":
            return WORKLOADS[self.config.workload]
        names, weights = zip(*MIXED_WEIGHTS.items(), strict=True)
        return WORKLOADS[self.rng.choices(names, weights)[0]]

    def _draw(self, median: int, sigma: float, ceiling: int) -> int:
        return max(1, min(ceiling, round(self.rng.lognormvariate(math.log(median), sigma))))

    def _system_messages(self) -> list[dict[str, str]]:
        if self.config.prefix == "shared":
            return [{"role": "system", "content": self.shared_prefix}]
        if self.config.prefix == "random":
            # A random first word is enough: prefix caching matches whole blocks from the start.
            return [{"role": "system", "content": words(self.rng, self.config.prefix_tokens)}]
        return []


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(WORDS, k=count))


def chat_body(spec: RequestSpec, model: str, options: Any) -> dict[str, Any]:
    """The OpenAI chat parameters shared by the SSE and WebSocket users."""
    body: dict[str, Any] = {
        "model": model,
        "messages": spec.messages,
        "max_tokens": spec.max_tokens,
        "temperature": options.temperature,
    }
    if options.ignore_eos:
        body["ignore_eos"] = True
    return body


# User-count profiles for the load shapes: (seconds since start, peak users) -> users now.


def constant_users(_elapsed: float, peak: int, _run_time: float) -> int:
    return peak


def step_users(elapsed: float, peak: int, run_time: float, steps: int = 5) -> int:
    """Ramp to `peak` in `steps` equal steps spread over the run, holding each."""
    step = min(steps, int(elapsed / (run_time / steps)) + 1)
    return max(1, math.ceil(peak * step / steps))


def spike_users(elapsed: float, peak: int, run_time: float) -> int:
    """A quarter of `peak`, with a burst to `peak` during the middle fifth of the run."""
    in_spike = 0.4 * run_time <= elapsed < 0.6 * run_time
    return peak if in_spike else max(1, peak // 4)


PROFILES = {"constant": constant_users, "step": step_users, "spike": spike_users}
