"""Workloads for the load tests: requests drawn with a fixed seed from
`baton.core.simulation.workloads`' request
classes (the simulator's and `baton bench`'s), shared or randomized system-prompt prefixes, and
the user-count profiles behind the load shapes (constant, step ramp, spike).

Prompt lengths are counted in words, which most BPE tokenizers map to about one token each; the
server's `usage.prompt_tokens` is the exact figure.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from baton.core.simulation.workloads import WORKLOADS

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


# The request classes (lengths, output caps) and their mixes are the simulator's and `baton
# bench`'s, so a locust run, a simulation and a bench run of one workload draw alike.
WORKLOAD_NAMES = tuple(WORKLOADS)
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
        classes, weights = zip(*WORKLOADS[self.config.workload], strict=True)
        request_class = self.rng.choices(classes, weights)[0]
        prompt_len = self.config.prompt_tokens or request_class.prompt.draw(self.rng)
        max_tokens = self.config.max_tokens or min(
            request_class.output.draw(self.rng), request_class.max_tokens
        )
        messages = self._system_messages()
        question = self.rng.choice(QUESTIONS)
        messages.append({"role": "user", "content": f"{words(self.rng, prompt_len)}\n{question}"})
        return RequestSpec(messages, max_tokens)

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
