"""The choices of one API request: what a whole (non-streamed) choice gathers from its engine
request, the prompt a completions choice echoes before its text, and the pick of the best `n`
of `best_of` candidates by cumulative log-probability."""

from __future__ import annotations

from dataclasses import dataclass, field

from baton.core.outputs import RequestOutput
from baton.core.text.tokenizer import Tokenizer


@dataclass(slots=True)
class Echo:
    """What a completions choice repeats of its prompt (`echo`): the text as sent (token ids
    are decoded) and the token ids its log-probabilities are listed for."""

    text: str
    token_ids: list[int]

    @classmethod
    def of(cls, prompt: str | list[int], token_ids: list[int], tokenizer: Tokenizer) -> Echo:
        text = prompt if isinstance(prompt, str) else tokenizer.decode(prompt)
        return cls(text, token_ids)


@dataclass(slots=True)
class ChoiceText:
    """What one choice of a whole response has gathered so far. `cumulative_logprob` sums its
    sampled tokens' log-probabilities, which `best_of` ranks by."""

    pieces: list[str] = field(default_factory=list)
    num_chars: int = 0
    logprobs: list[dict] = field(default_factory=list)
    final: RequestOutput | None = None
    cumulative_logprob: float = 0.0
    prompt_logprobs: list[dict | None] | None = None

    def add_text(self, text: str) -> None:
        self.pieces.append(text)
        self.num_chars += len(text)

    def add_logprobs(self, output: RequestOutput) -> None:
        if output.logprobs:
            self.cumulative_logprob += sum(entry.logprob for entry in output.logprobs)


def best_choices(choices: list[ChoiceText], num_candidates: int, n: int) -> list[ChoiceText]:
    """Per prompt (its `num_candidates` consecutive candidates), the `n` with the highest
    cumulative log-probability, best first; ties keep the candidates' order."""
    picked = []
    for start in range(0, len(choices), num_candidates):
        group = choices[start : start + num_candidates]
        picked.extend(sorted(group, key=lambda choice: -choice.cumulative_logprob)[:n])
    return picked
