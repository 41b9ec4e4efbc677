"""The cost bounds one request must stay within, checked at admission before any work: how big
its output constraint is (what compiling it costs), its stop_token_ids, and how many
log-probabilities it asks for (what scoring it costs and how large its answer grows).

Each bound is a setting (a `baton serve` flag) with a default that keeps one request's compile
to about a second and its answer to a few megabytes on a small CPU (docs/decisions.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields

from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.core.setting import flag_of, setting
from baton.core.structured_output import GuideKind, StructuredOutput

# A regex's counted repetition: `{n}`, `{n,}` or `{m,n}`; its largest number is what it costs.
_REPETITION = re.compile(r"\{(\d+)(?:,(\d*))?\}")
# A schema's counts that bound a string's length (rewritten as repetitions before compiling).
_LENGTH_KEYS = ("minLength", "maxLength")
# Values, not schemas: their strings are literals the output spells out.
_LITERAL_KEYS = ("enum", "const")


@dataclass(slots=True)
class RequestBounds:
    """What one request may ask of the server; past any bound it gets a 400 naming the field
    and the flag."""

    max_grammar_bytes: int = setting(
        8 * 1024,
        help="the most characters a regex or EBNF grammar (guided_regex, guided_grammar) may "
        "have: its compile time grows with the square of its long literals",
    )
    max_schema_bytes: int = setting(
        64 * 1024,
        help="the most characters a JSON schema (response_format, guided_json, a forced tool "
        "call's parameters) or guided_choice's choices may have",
    )
    max_schema_depth: int = setting(
        64, help="the deepest a JSON schema's text may nest (its JSON objects and arrays)"
    )
    max_schema_properties: int = setting(
        256,
        help="the most properties a JSON schema may declare, all its objects together: optional "
        "ones compile in time growing faster than their square",
    )
    max_grammar_choices: int = setting(
        1024, help="the most values a JSON schema's enums or a guided_choice may list, together"
    )
    max_grammar_literal_chars: int = setting(
        256,
        help="the longest string a JSON schema's enum, const or property name, or one "
        "guided_choice, may be",
    )
    max_schema_string_lengths: int = setting(
        1024,
        help="the most a JSON schema's string length bounds (minLength, maxLength, and the "
        "{m,n} counts of its patterns) may add up to: each compiles into that many states",
    )
    grammar_compile_timeout_s: float = setting(
        10.0,
        name="--grammar-compile-timeout",
        help="seconds an output constraint may take to compile (400 after)",
    )
    max_stop_token_ids: int = setting(256, help="the most stop_token_ids a request may send")
    max_logprobs_entries: int = setting(
        262_144,
        help="the most log-probabilities one response may carry: for each prompt and choice, "
        "its scored prompt tokens and max_tokens, each times 1 + its top logprobs",
    )

    def __post_init__(self) -> None:
        for name in _FLAG_NAMES:
            value = getattr(self, name)
            if not value > 0:
                flag = _FLAG_NAMES[name]
                raise ValueError(f"{flag} must be a positive number, got {value}")

    def check_constraint(self, constraint: StructuredOutput) -> None:
        """InvalidRequestError naming the constraint's field when it is larger than the
        bounds: checked on its text, before anything compiles it."""
        kind, spec, param = constraint.kind, constraint.spec, constraint.param
        if kind in (GuideKind.REGEX, GuideKind.GRAMMAR):
            self._bound("max_grammar_bytes", len(spec), f"{param} has {{}} characters", param)
            return
        if kind is GuideKind.JSON_OBJECT:
            return
        self._bound("max_schema_bytes", len(spec), f"{param} has {{}} characters", param)
        value = json.loads(spec)
        if kind is GuideKind.CHOICE:
            self._check_literals(value, param)
            return
        shape = SchemaShape.of(value)
        self._bound("max_schema_depth", shape.depth, f"{param} nests {{}} levels deep", param)
        self._bound(
            "max_schema_properties",
            shape.num_properties,
            f"{param} declares {{}} properties",
            param,
        )
        self._bound(
            "max_schema_string_lengths",
            shape.string_lengths,
            f"{param}'s string length bounds add up to {{}} characters",
            param,
        )
        self._check_literals(shape.literals, param)

    def check_stop_token_ids(self, params: SamplingParams) -> None:
        """InvalidRequestError when `stop_token_ids` is longer than the bound: every step
        checks each of them for each request. (Stop strings have SamplingParams' own caps.)"""
        self._bound(
            "max_stop_token_ids",
            len(params.stop_token_ids),
            "stop_token_ids has {} ids",
            "stop_token_ids",
            "send fewer",
        )

    def check_logprobs(
        self,
        params: SamplingParams,
        prompt_lengths: Sequence[int],
        num_choices: int,
        max_output_tokens: int,
    ) -> None:
        """InvalidRequestError when the response would carry more log-probabilities than the
        bound: each of `num_choices` choices of each prompt lists its prompt's (when asked) and
        its output tokens', each with its top alternatives. An unset `max_tokens` counts as
        `max_output_tokens`, the most the request could generate."""
        entries = 0
        if params.prompt_logprobs is not None:
            entries += sum(prompt_lengths) * (1 + params.prompt_logprobs)
        if params.logprobs is not None:
            max_tokens = params.max_tokens if params.max_tokens is not None else max_output_tokens
            entries += len(prompt_lengths) * max_tokens * (1 + params.logprobs)
        param = "logprobs" if params.logprobs is not None else "prompt_logprobs"
        self._bound(
            "max_logprobs_entries",
            entries * num_choices,
            "the response would carry {} log-probabilities (prompts × prompt tokens and "
            f"max_tokens × n × (1 + {param}))",
            param,
            "ask for fewer top logprobs, a smaller n or max_tokens, or fewer prompts",
        )

    def _check_literals(self, literals: list[object], param: str) -> None:
        self._bound("max_grammar_choices", len(literals), f"{param} lists {{}} values", param)
        longest = max((len(s) for s in literals if isinstance(s, str)), default=0)
        self._bound(
            "max_grammar_literal_chars",
            longest,
            f"{param} has a literal string of {{}} characters",
            param,
        )

    def _bound(
        self, name: str, value: int, what: str, param: str, change: str = "simplify it"
    ) -> None:
        """InvalidRequestError when `value` passes the bound `name`: `what` says what was
        counted (`{}` for the count), and the message names the bound's flag."""
        limit = getattr(self, name)
        if value > limit:
            flag = _FLAG_NAMES[name]
            raise InvalidRequestError(
                f"{what.format(value)}, more than this server's limit of {limit} ({flag}); "
                f"{change}",
                param,
            )


@dataclass(slots=True)
class SchemaShape:
    """What a JSON schema's compile cost grows with, read in one walk."""

    depth: int = 0
    num_properties: int = 0
    # minLength/maxLength bounds and pattern repetition counts, summed.
    string_lengths: int = 0
    # enum values, consts and property names: strings the output may have to spell out.
    literals: list[object] = field(default_factory=list)

    @classmethod
    def of(cls, schema: object) -> SchemaShape:
        shape = cls()
        # Iterative, so a schema nested deeper than Python's recursion limit is only counted.
        stack: list[tuple[object, int]] = [(schema, 1)]
        while stack:
            node, depth = stack.pop()
            if isinstance(node, list):
                shape.depth = max(shape.depth, depth)
                stack.extend((item, depth + 1) for item in node)
            elif isinstance(node, dict):
                shape.depth = max(shape.depth, depth)
                shape._count(node)
                stack.extend(
                    (value, depth + 1) for key, value in node.items() if key not in _LITERAL_KEYS
                )
        return shape

    def _count(self, schema: dict) -> None:
        properties = schema.get("properties")
        if isinstance(properties, dict):
            self.num_properties += len(properties)
            self.literals.extend(properties)
        enum = schema.get("enum")
        if isinstance(enum, list):
            self.literals.extend(enum)
        if "const" in schema:
            self.literals.append(schema["const"])
        lengths = [schema.get(key) for key in _LENGTH_KEYS]
        self.string_lengths += max((n for n in lengths if isinstance(n, int)), default=0)
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            self.string_lengths += sum(_repetitions(pattern))


def _repetitions(pattern: str) -> Iterator[int]:
    for match in _REPETITION.finditer(pattern):
        low, high = match.group(1), match.group(2)
        yield max(int(low), int(high) if high else 0)


# Each bound's flag, for messages: its field's name spelt as a flag (baton.app.flags).
_FLAG_NAMES = {
    field.name: flag.name or "--" + field.name.replace("_", "-")
    for field in fields(RequestBounds)
    if (flag := flag_of(field)) is not None
}
