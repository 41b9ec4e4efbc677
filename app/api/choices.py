"""The choices of one API request: what a whole (non-streamed) choice gathers from its engine
request, the prompt a completions choice echoes before its text, the prompt's scores shared by
the candidates of one prompt, and the pick of the best `n` of `best_of` candidates by
cumulative log-probability."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
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


async def shared_prompt_scores(
    outputs: AsyncIterator[tuple[int, RequestOutput]], num_candidates: int
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """`outputs` (index, output) of `num_candidates` consecutive candidates per prompt, where
    only each prompt's first candidate scores the prompt (admission asks the others for no
    `prompt_logprobs`): every other candidate's first output gets the first's scores. Outputs
    of a candidate that come before them are held back, in order, until they do."""
    scores: dict[int, list] = {}
    held: dict[int, list[tuple[int, RequestOutput]]] = {}
    given: set[int] = set()

    def with_scores(index: int, output: RequestOutput) -> tuple[int, RequestOutput]:
        if index in given:
            return index, output
        given.add(index)
        return index, dataclasses.replace(output, prompt_logprobs=scores[index // num_candidates])

    # Closing this closes `outputs`, and so aborts their requests.
    async with contextlib.aclosing(outputs):
        async for index, output in outputs:
            group = index // num_candidates
            if index % num_candidates == 0:
                given.add(index)
                if output.prompt_logprobs is not None:
                    scores[group] = output.prompt_logprobs
                yield index, output
                if group in scores:
                    for waiting in held.pop(group, []):
                        yield with_scores(*waiting)
            elif group in scores:
                yield with_scores(index, output)
            else:
                held.setdefault(group, []).append((index, output))
    # Only when a first candidate ended without scores (it failed): the rest as they came.
    for waiting in held.values():
        for item in waiting:
            yield item
