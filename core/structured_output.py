"""What a structured-output request asks for (a JSON schema, any JSON object, a regex, one of
some choices, an EBNF grammar), as plain data the scheduler carries to the executor.

The executor compiles it into a grammar before the request enters the engine and owns the
per-request matcher; core only passes the compiled grammar along, unopened.
"""

from __future__ import annotations

import dataclasses
import enum
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
    """

    kind: GuideKind
    spec: str = ""
    param: str = "response_format"
    grammar: object | None = field(default=None, compare=False, repr=False)

    @property
    def cache_key(self) -> tuple[str, str]:
        return (self.kind.value, self.spec)

    def compiled(self, grammar: object) -> StructuredOutput:
        return dataclasses.replace(self, grammar=grammar)


class GrammarCompiler(Protocol):
    """Compiles constraints for one model's vocabulary; an executor that supports structured
    output exposes one as `grammar_compiler`. Thread-safe: admission calls it from workers."""

    def compile(self, constraint: StructuredOutput) -> StructuredOutput:
        """`constraint` with its compiled grammar; InvalidRequestError naming `param` if the
        constraint cannot compile."""
        ...
