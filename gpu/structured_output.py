"""Structured output with xgrammar: grammars compiled once per constraint (an LRU bounded in
bytes, off the step thread), one matcher per constrained request, and the step's token bitmask.

The matchers live here, keyed by request id, because they are mutable per-request state of
the sampler, like its generators: core hands over the compiled grammar and the tokens so far,
and each step the matcher is brought level with those tokens before its mask is filled, so
preemption, recompute or a re-run step can never make it accept a token twice.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import xgrammar
from transformers import PreTrainedTokenizerFast

from baton.core.batch import ScheduledSequence
from baton.core.sampling_params import InvalidRequestError
from baton.core.structured_output import GuideKind, StructuredOutput

logger = logging.getLogger(__name__)

# Bytes of compiled grammars kept; a schema sent again skips compilation.
GRAMMAR_CACHE_BYTES = 256 * 1024 * 1024

# Compact JSON, as `json.dumps(..., separators=(",", ":"))` writes it: free whitespace would let
# a model pad forever between tokens, and xgrammar's default separators put a space after each
# comma and colon.
COMPACT_JSON = {"any_whitespace": False, "separators": (",", ":")}


class XGrammarCompiler:
    """Compiles constraints against one tokenizer's vocabulary, padded to the model's logits."""

    def __init__(
        self,
        tokenizer_dir: Path,
        model_vocab_size: int,
        stop_token_ids: list[int],
        cache_bytes: int = GRAMMAR_CACHE_BYTES,
    ) -> None:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
        # The bitmask spans the model's logits: ids past the tokenizer's vocabulary (padded
        # embeddings) get empty strings, which no grammar ever allows.
        # Without EOS ids in the model's config, xgrammar finds the stop tokens by their names.
        self.tokenizer_info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=model_vocab_size, stop_token_ids=stop_token_ids or None
        )
        # Baton's LRU is the cache, sized in bytes; xgrammar's own would keep a second copy.
        self._compiler = xgrammar.GrammarCompiler(
            self.tokenizer_info, max_threads=1, cache_enabled=False
        )
        self._cache: OrderedDict[tuple[str, str], xgrammar.CompiledGrammar] = OrderedDict()
        self.cache_limit_bytes = cache_bytes
        self._cache_bytes = 0
        self._lock = threading.Lock()

    def compile(self, constraint: StructuredOutput) -> StructuredOutput:
        key = constraint.cache_key
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                return constraint.compiled(grammar)
        grammar = self._compile(constraint)
        size = grammar.memory_size_bytes
        with self._lock:
            if key not in self._cache:
                self._cache[key] = grammar
                self._cache_bytes += size
            # Oldest first: a grammar larger than the whole limit serves its request uncached.
            while self._cache_bytes > self.cache_limit_bytes:
                _, evicted = self._cache.popitem(last=False)
                self._cache_bytes -= evicted.memory_size_bytes
        return constraint.compiled(grammar)

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        """What the cached grammars hold, as xgrammar counts their memory."""
        return self._cache_bytes

    def _compile(self, constraint: StructuredOutput) -> xgrammar.CompiledGrammar:
        kind, spec = constraint.kind, constraint.spec
        try:
            if kind is GuideKind.JSON_SCHEMA:
                schema = json.dumps(bounded_strings_as_patterns(json.loads(spec)))
                return self._compiler.compile_json_schema(schema, **COMPACT_JSON)
            if kind is GuideKind.JSON_OBJECT:
                return self._compiler.compile_json_schema('{"type": "object"}', **COMPACT_JSON)
            if kind is GuideKind.REGEX:
                return self._compiler.compile_regex(spec)
            if kind is GuideKind.CHOICE:
                return self._compiler.compile_regex(_choice_regex(json.loads(spec)))
            return self._compiler.compile_grammar(spec)
        except (RuntimeError, ValueError) as error:
            # xgrammar's message says what is wrong and where; the client can act on it.
            reason = str(error).strip().splitlines()[-1] if str(error).strip() else "invalid"
            raise InvalidRequestError(
                f"{constraint.param} cannot be compiled into a grammar: {reason}",
                constraint.param,
            ) from None


# One JSON string character of a length-bounded string: printable ASCII but the quote and the
# backslash, or an escape. ASCII only: with a negated class, a sampled string once decoded to
# replacement characters (bytes that were no whole UTF-8 character), each counted against the
# bound (tests/test_structured_output.py, bounded_strings); others are written as \uXXXX.
_JSON_CHAR = r'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
# Values, not schemas: never rewritten.
_LITERAL_KEYS = frozenset({"enum", "const", "default", "examples"})


def bounded_strings_as_patterns(schema: object) -> object:
    """`schema` with every `minLength`/`maxLength` string (without a pattern or format of its
    own) spelled as an equivalent pattern: xgrammar 0.2.8 compiles length bounds to a character
    class that admits control characters, which no JSON parser accepts in a string."""
    if isinstance(schema, list):
        return [bounded_strings_as_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rewritten = {
        key: value if key in _LITERAL_KEYS else bounded_strings_as_patterns(value)
        for key, value in schema.items()
    }
    bounded = "minLength" in schema or "maxLength" in schema
    plain = not {"pattern", "format", "enum", "const"} & schema.keys()
    if schema.get("type") == "string" and bounded and plain:
        low = rewritten.pop("minLength", 0)
        high = rewritten.pop("maxLength", "")
        rewritten["pattern"] = f"^{_JSON_CHAR}{{{low},{high}}}$"
    return rewritten


def _choice_regex(choices: list[str]) -> str:
    return "|".join(_regex_literal(choice) for choice in choices)


_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _regex_literal(text: str) -> str:
    # Every character outside [A-Za-z0-9 _] escaped: xgrammar's regex syntax is a subset of
    # Python's, and escaping a punctuation mark is always allowed there.
    return "".join(
        c if c.isalnum() or c in " _" else _CONTROL_ESCAPES.get(c, "\\" + c) for c in text
    )


@dataclass(slots=True)
class _Matcher:
    matcher: xgrammar.GrammarMatcher
    # Where the governed output starts (past a reasoning model's end of thinking, else 0).
    # Fixed once found: committed output tokens are never taken back.
    start: int = 0
    num_accepted: int = 0


@dataclass(slots=True)
class GrammarMask:
    """The allowed next tokens of the constrained rows of one step's sampled sequences."""

    bitmask: torch.Tensor
    rows: list[int]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` with every disallowed token of a constrained row at -inf (a new tensor)."""
        masked = logits.clone(memory_format=torch.contiguous_format)
        xgrammar.apply_token_bitmask_inplace(
            masked, self.bitmask.to(masked.device, non_blocking=True), indices=self.rows
        )
        return masked


class GrammarMatchers:
    """Each constrained request's matcher, created on its first sampled step."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._matchers: dict[str, _Matcher] = {}
        self._batch = xgrammar.BatchGrammarMatcher(max_threads=1)

    def __len__(self) -> int:
        return len(self._matchers)

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._matchers.pop(request_id, None)

    def fill_mask(self, sequences: Sequence[ScheduledSequence]) -> GrammarMask | None:
        """The bitmask of the constrained rows among `sequences` (the rows to be sampled); a
        reasoning model's row is free until its thinking has ended."""
        rows, matchers = [], []
        for row, seq in enumerate(sequences):
            if seq.sampling_params.structured_output is None:
                continue
            matcher = self._level_with(seq)
            if matcher is not None:
                rows.append(row)
                matchers.append(matcher)
        if not rows:
            return None
        bitmask = xgrammar.allocate_token_bitmask(len(sequences), self.vocab_size)
        self._batch.batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)
        return GrammarMask(bitmask, rows)

    def fill_draft_mask(self, rows: Sequence[ScheduledSequence]) -> GrammarMask | None:
        """As `fill_mask`, for speculative decoding's verification rows (rejection_sampler.py),
        where one request has a row per draft, each seeing one more draft as output: each row is
        filled on its own, its matcher levelled to that row's output first. Past a draft the
        grammar refuses, the request's rows stay free (verification stops at that draft: its
        logit is -inf). Each matcher is rolled back to its committed output afterwards, so the
        next levelling starts from tokens the request really has."""
        bitmask = xgrammar.allocate_token_bitmask(len(rows), self.vocab_size)
        filled = []
        committed: dict[str, int] = {}
        for row, seq in enumerate(rows):
            if seq.sampling_params.structured_output is None:
                continue
            matcher = self._level_with(seq)
            # A request's first row holds no drafts: its count is the committed output's.
            if seq.request_id not in committed and seq.request_id in self._matchers:
                committed[seq.request_id] = self._matchers[seq.request_id].num_accepted
            if matcher is None:
                continue
            matcher.fill_next_token_bitmask(bitmask, row)
            filled.append(row)
        for request_id, num_accepted in committed.items():
            state = self._matchers[request_id]
            if state.num_accepted > num_accepted:
                state.matcher.rollback(state.num_accepted - num_accepted)
                state.num_accepted = num_accepted
        return GrammarMask(bitmask, filled) if filled else None

    def accept(self, sequences: Sequence[ScheduledSequence], token_ids: Sequence[int]) -> None:
        """Advance the constrained rows' matchers past this step's sampled tokens."""
        for seq, token_id in zip(sequences, token_ids, strict=True):
            state = self._matchers.get(seq.request_id)
            if state is None:
                continue
            if not state.matcher.accept_token(token_id):
                logger.warning(
                    "request %s: token %d is outside its grammar", seq.request_id, token_id
                )
                continue
            state.num_accepted += 1

    def _level_with(self, seq: ScheduledSequence) -> xgrammar.GrammarMatcher | None:
        """The request's matcher having accepted exactly its governed output tokens so far;
        None while its grammar has not started (a reasoning model still thinking)."""
        outputs = seq.all_token_ids[seq.num_prompt_tokens :]
        state = self._matchers.get(seq.request_id)
        if state is None:
            constraint = seq.sampling_params.structured_output
            assert constraint is not None and constraint.grammar is not None
            start = constraint.governed_from(outputs)
            if start is None:
                return None
            state = _Matcher(xgrammar.GrammarMatcher(constraint.grammar), start)
            self._matchers[seq.request_id] = state
        num_governed = len(outputs) - state.start
        if state.num_accepted > num_governed:
            # A step re-run (fault isolation) after its tokens were accepted: undo them.
            state.matcher.rollback(state.num_accepted - num_governed)
            state.num_accepted = num_governed
        while state.num_accepted < num_governed:
            if not state.matcher.accept_token(outputs[state.start + state.num_accepted]):
                return None  # a draft the grammar refuses: the row is not verified past it
            state.num_accepted += 1
        return state.matcher
