"""A reasoning model's thinking split from its answer (`--reasoning-parser`, vLLM's names):
the text inside `<think>...</think>` becomes `reasoning_content` in chat messages and stream
deltas, and structured output starts where the thinking ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.core.text.tokenizer import Tokenizer

# Prompt tokens read back to see whether the chat template opened or closed the thinking.
PROMPT_TAIL_TOKENS = 8


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """How a model family marks its thinking. `follows_enable_thinking`: its templates switch
    thinking off with the `enable_thinking: false` variable, and then all output is answer."""

    start_tag: str = "<think>"
    end_tag: str = "</think>"
    follows_enable_thinking: bool = False


# DeepSeek-R1 thinks from its first token (its template opens the block); Qwen3 writes the
# opening tag itself unless told not to think. Either may write `<think>` first.
REASONING_PARSERS = {
    "deepseek_r1": ReasoningFormat(),
    "qwen3": ReasoningFormat(follows_enable_thinking=True),
}


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    """A format checked against the served tokenizer, with the token id that ends thinking."""

    name: str
    format: ReasoningFormat
    end_token_id: int

    def thinks_first(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int],
        template_variables: dict[str, Any],
        continued_message: str | None = None,
    ) -> bool:
        """Whether a chat's output starts inside the thinking. The prompt's end decides where
        it shows a tag (a template that opens the block, or closes an empty one when thinking
        is off); a continued message (`continue_final_message`) is thinking only if it opened
        the block and did not close it; otherwise the model thinks first, unless its template
        was told `enable_thinking: false`."""
        start, end = self.format.start_tag, self.format.end_tag
        if continued_message is not None:
            return continued_message.rfind(start) > continued_message.rfind(end)
        tail = prompt_token_ids[-PROMPT_TAIL_TOKENS:]
        text = tokenizer.decode(tail, skip_special_tokens=False).rstrip()
        if text.endswith(end):
            return False
        if text.endswith(start):
            return True
        return not (
            self.format.follows_enable_thinking
            and template_variables.get("enable_thinking") is False
        )


def reasoning_parser(name: str | None, tokenizer: Tokenizer) -> ReasoningParser | None:
    """The parser `name`d for `tokenizer`; ValueError where its tags are not tokens decoding
    keeps (structured output finds the end of thinking by its token id)."""
    if name is None:
        return None
    form = REASONING_PARSERS[name]
    ids = []
    for tag in (form.start_tag, form.end_tag):
        token_id = tokenizer.token_to_id(tag)
        if token_id is None:
            raise ValueError(
                f"--reasoning-parser {name}: {tag} is not a token of this model's tokenizer, so "
                "the model does not think in that format; leave the flag out"
            )
        if token_id in tokenizer.all_special_ids:
            raise ValueError(
                f"--reasoning-parser {name}: {tag} is a special token of this tokenizer, which "
                'decoding leaves out of the text; mark it "special": false in tokenizer.json'
            )
        ids.append(token_id)
    return ReasoningParser(name, form, ids[1])


class ReasoningStream:
    """One choice's text split into thinking and answer as it arrives. A possible start of a
    tag is held back until the next text shows whether it is one, so a tag split across
    deltas is still found; the opening tag, where the model writes one first, is dropped."""

    def __init__(self, form: ReasoningFormat, thinking: bool) -> None:
        self.format = form
        self.thinks = thinking
        self._opening = thinking  # at the start of the thinking: an opening tag may come
        self._answering = not thinking
        self._held = ""
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str) -> tuple[str, str]:
        """The (reasoning, answer) text that `text` completes."""
        text = self._held + text
        self._held = ""
        reasoning = ""
        if self._opening:
            start = self.format.start_tag
            if start.startswith(text):
                self._held = text  # all of it may still become the opening tag
                return "", ""
            self._opening = False
            text = text.removeprefix(start)
        if not self._answering:
            end = self.format.end_tag
            index = text.find(end)
            if index < 0:
                keep = _partial_tag_length(text, end)
                reasoning, self._held = text[: len(text) - keep], text[len(text) - keep :]
                text = ""
            else:
                reasoning, text = text[:index], text[index + len(end) :]
                self._answering = True
        self.reasoning += reasoning
        self.content += text
        return reasoning, text

    def finish(self) -> tuple[str, str]:
        """The text held back, once the output is complete: part of the thinking."""
        held, self._held = self._held, ""
        self.reasoning += held
        return held, ""

    def message_fields(self) -> dict[str, Any]:
        """`reasoning_content` and `content` of the final message (after `finish`): null
        reasoning for an output that never thought, null content for one that only did."""
        if not self.thinks:
            return {"reasoning_content": None, "content": self.content}
        return {"reasoning_content": self.reasoning, "content": self.content or None}


def _partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
