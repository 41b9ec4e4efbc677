"""What a structured-output request asks for (a JSON schema, any JSON object, a regex, one of
some choices, an EBNF grammar), as plain data the scheduler carries to the executor.

The executor compiles it into a grammar before the request enters the engine and owns the
per-request matcher; core only passes the compiled grammar along, unopened.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class GuideKind(str, enum.Enum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"


@dataclass(slots=True, frozen=True)
class StructuredOutput:
    """A constraint on a request's output text.

    `spec` is the constraint's canonical text: the schema as JSON with sorted keys, the regex,
    the EBNF grammar, or the choices as a JSON array; with `kind` it is the compile cache's key.
    `param` names the request field it came from, for error messages. `grammar` is the
    executor's compiled form (opaque here), attached by `GrammarCompiler.compile`.
    `after_token_id`, where set, is the token that ends a reasoning model's thinking (`</think>`):
    the output is free up to its first occurrence, and the grammar governs what follows it.
    """

    kind: GuideKind
    spec: str = ""
    param: str = "response_format"
    grammar: object | None = field(default=None, compare=False, repr=False)
    after_token_id: int | None = None

    @property
    def cache_key(self) -> tuple[str, str]:
        return (self.kind.value, self.spec)

    def compiled(self, grammar: object) -> StructuredOutput:
        return dataclasses.replace(self, grammar=grammar)

    def governed_from(self, output_token_ids: Sequence[int]) -> int | None:
        """Where in the output the grammar starts: 0, or just past the first `after_token_id`;
        None while that token has not come yet."""
        if self.after_token_id is None:
            return 0
        try:
            return output_token_ids.index(self.after_token_id) + 1
        except ValueError:
            return None


class GrammarCompiler(Protocol):
    """Compiles constraints for one model's vocabulary; an executor that supports structured
    output exposes one as `grammar_compiler`. Thread-safe: admission calls it from workers."""

    def compile(self, constraint: StructuredOutput) -> StructuredOutput:
        """`constraint` with its compiled grammar; InvalidRequestError naming `param` if the
        constraint cannot compile."""
        ...

    @property
    def num_cached(self) -> int:
        """Compiled constraints kept for reuse."""
        ...

    @property
    def cached_bytes(self) -> int:
        """The memory they hold, in bytes."""
        ...
