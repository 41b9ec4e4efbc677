"""--reasoning-parser: a reasoning model's `<think>...</think>` text comes back as
`reasoning_content` in chat messages and stream deltas (tags split across deltas included), and
structured output governs only what follows the thinking."""

from __future__ import annotations

import asyncio

import openai
import pytest
import torch

from baton.app.api.reasoning import (
    REASONING_PARSERS,
    ReasoningStream,
    reasoning_parser,
)
from baton.core.batch import ScheduledSequence
from baton.core.sampling_params import SamplingParams
from baton.core.structured_output import GuideKind, StructuredOutput
from baton.core.text.tokenizer import Tokenizer
from baton.gpu.structured_output import GrammarMask, GrammarMatchers, XGrammarCompiler
from tests.server_harness import (
    ScriptedExecutor,
    base_url,
    model_engine,
    running_server,
    simulated_engine,
)

QWEN3 = REASONING_PARSERS["qwen3"]
MESSAGES = [{"role": "user", "content": "Is it raining?"}]
THOUGHT, ANSWER = "Let me look outside.", "It is not raining."


def split_whole(text: str, thinking: bool = True) -> tuple[str, str]:
    stream = ReasoningStream(QWEN3, thinking)
    reasoning, content = stream.feed(text)
    rest, _ = stream.finish()
    return reasoning + rest, content


def split_by_character(text: str, thinking: bool = True) -> tuple[str, str]:
    stream = ReasoningStream(QWEN3, thinking)
    pieces = [stream.feed(character) for character in text] + [stream.finish()]
    return "".join(r for r, _ in pieces), "".join(c for _, c in pieces)


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        (f"<think>{THOUGHT}</think>{ANSWER}", THOUGHT, ANSWER),
        # DeepSeek-R1's template opens the block, so the output starts inside it.
        (f"{THOUGHT}</think>{ANSWER}", THOUGHT, ANSWER),
        # Cut short while thinking: all of it is thinking, a half-written tag included.
        (f"<think>{THOUGHT}</thi", f"{THOUGHT}</thi", ""),
        # Only the first end tag ends the thinking; a later one is answer text.
        ("a</think>b</think>c", "a", "b</think>c"),
        ("<thinking aloud>x</think>y", "<thinking aloud>x", "y"),
        ("<th", "<th", ""),
    ],
)
def test_thinking_splits_the_same_whole_or_one_character_at_a_time(text, reasoning, content):
    assert split_whole(text) == (reasoning, content)
    assert split_by_character(text) == (reasoning, content)


def test_an_output_that_starts_answering_is_all_content():
    text = f"<think>{THOUGHT}</think>{ANSWER}"
    assert split_by_character(text, thinking=False) == ("", text)
    stream = ReasoningStream(QWEN3, thinking=False)
    stream.feed(text)
    assert stream.message_fields() == {"reasoning_content": None, "content": text}


def test_a_parser_needs_its_tags_as_tokens_that_decoding_keeps(llama_checkpoint, think_checkpoint):
    plain = Tokenizer.from_pretrained(llama_checkpoint)
    with pytest.raises(ValueError, match="<think> is not a token"):
        reasoning_parser("qwen3", plain)
    parser = reasoning_parser("deepseek_r1", Tokenizer.from_pretrained(think_checkpoint))
    assert parser is not None and parser.end_token_id == 513
    assert reasoning_parser(None, plain) is None


@pytest.mark.parametrize(
    ("name", "prompt_end", "variables", "thinks"),
    [
        ("qwen3", "<|assistant|>\n", {}, True),
        ("qwen3", "<|assistant|>\n<think>\n\n</think>\n\n", {"enable_thinking": False}, False),
        # A template that does not show the switch: Qwen3 still answers without thinking.
        ("qwen3", "<|assistant|>\n", {"enable_thinking": False}, False),
        ("deepseek_r1", "<|assistant|>\n", {"enable_thinking": False}, True),
        ("deepseek_r1", "<|assistant|>\n<think>\n", {}, True),
        # A closed block earlier in the conversation is not this answer's.
        ("qwen3", "</think>\nDone.<|end|>\n<|assistant|>\n", {}, True),
    ],
)
def test_the_prompt_end_says_whether_the_answer_starts_thinking(
    think_checkpoint, name, prompt_end, variables, thinks
):
    tokenizer = Tokenizer.from_pretrained(think_checkpoint)
    parser = reasoning_parser(name, tokenizer)
    prompt = tokenizer.encode("<|user|>\nhi<|end|>\n" + prompt_end, add_special_tokens=False)
    assert parser.thinks_first(tokenizer, prompt, variables) is thinks


def test_a_continued_message_thinks_only_inside_an_open_block(think_checkpoint):
    tokenizer = Tokenizer.from_pretrained(think_checkpoint)
    parser = reasoning_parser("qwen3", tokenizer)
    assert parser.thinks_first(tokenizer, [5], {}, "<think>First,")
    assert not parser.thinks_first(tokenizer, [5], {}, "<think>Done.</think>The answer")
    assert not parser.thinks_first(tokenizer, [5], {}, "The answer is")


# --- served, on scripted answers ---------------------------------------------------------


@pytest.fixture(scope="module")
def scripted(think_checkpoint):
    tokenizer = Tokenizer.from_pretrained(think_checkpoint)
    executor = ScriptedExecutor(tokenizer.vocab_size, tokenizer.eos_token_id)
    engine = simulated_engine(think_checkpoint, executor)
    with running_server(engine, model_name="tiny", reasoning_parser="qwen3") as state:
        yield state, executor


def client(state) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)


def answer_with(scripted, text: str) -> None:
    state, executor = scripted
    executor.answer = state.tokenizer.encode(text, add_special_tokens=False)


async def whole_and_streamed(state, **fields):
    async with client(state) as api:
        whole = await api.chat.completions.create(model="tiny", messages=MESSAGES, **fields)
        stream = await api.chat.completions.create(
            model="tiny", messages=MESSAGES, stream=True, **fields
        )
        deltas = [chunk.choices[0].delta async for chunk in stream if chunk.choices]
    return whole.choices[0].message, deltas


def joined(deltas, key: str) -> str:
    """One field of the deltas put together; `reasoning_content` is not the client's own."""
    return "".join(getattr(d, key, None) or (d.model_extra or {}).get(key) or "" for d in deltas)


@pytest.mark.parametrize("stop", [None, ["#" * 12]])
def test_chat_returns_the_thinking_as_reasoning_content_whole_and_streamed(scripted, stop):
    """A long stop string holds text back, so deltas break at other places than tokens do:
    the tags still never leak into either field."""
    state, _ = scripted
    answer_with(scripted, f"<think>{THOUGHT}</think>{ANSWER}")
    message, deltas = asyncio.run(whole_and_streamed(state, stop=stop, max_tokens=64))
    assert message.model_extra["reasoning_content"] == THOUGHT
    assert message.content == ANSWER
    assert joined(deltas, "reasoning_content") == THOUGHT
    assert joined(deltas, "content") == ANSWER
    # The thinking comes first, in deltas of its own.
    first_content = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not (d.model_extra or {}).get("reasoning_content") for d in deltas[first_content:])


def test_thinking_switched_off_in_the_template_leaves_the_answer_whole(scripted):
    state, _ = scripted
    answer_with(scripted, ANSWER)
    fields = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    message, deltas = asyncio.run(whole_and_streamed(state, **fields))
    assert message.content == ANSWER and message.model_extra["reasoning_content"] is None
    assert joined(deltas, "content") == ANSWER and not joined(deltas, "reasoning_content")


def test_an_answer_cut_short_while_thinking_has_null_content(scripted):
    state, _ = scripted
    answer_with(scripted, f"<think>{THOUGHT}")
    message, _ = asyncio.run(whole_and_streamed(state, max_tokens=64))
    assert message.model_extra["reasoning_content"] == THOUGHT
    assert message.content is None


# --- structured output after the thinking, on a random model -----------------------------

CHOICES = ["yes", "no"]


@pytest.fixture(scope="module")
def model_server(think_checkpoint):
    engine = model_engine(think_checkpoint, num_kv_blocks=256, max_num_seqs=8)
    with running_server(engine, model_name="tiny", reasoning_parser="qwen3") as state:
        yield state


def test_the_grammar_governs_only_what_follows_the_thinking(model_server):
    """A logit bias all but forces `</think>` wherever it is allowed. It comes first, where
    the grammar (which has no place for it) does not yet apply, and never again after: from
    there on the grammar masks it and the answer is one of the choices."""
    end = model_server.tokenizer.token_to_id("</think>")

    async def ask(**extra):
        async with client(model_server) as api:
            return await api.chat.completions.create(
                model="tiny",
                messages=MESSAGES,
                max_tokens=16,
                temperature=1.0,
                logit_bias={str(end): 100},
                extra_body={"structured_outputs": {"choice": CHOICES}, **extra},
            )

    thought = asyncio.run(ask()).choices[0]
    assert thought.message.model_extra["reasoning_content"] == ""
    assert thought.message.content in CHOICES
    assert thought.finish_reason == "stop"
    # Thinking switched off in the prompt: the grammar applies from the first token.
    direct = asyncio.run(ask(chat_template_kwargs={"enable_thinking": False})).choices[0]
    assert direct.message.model_extra["reasoning_content"] is None
    assert direct.message.content in CHOICES


def test_a_matcher_starts_after_the_end_of_thinking_and_stays_level(think_checkpoint):
    """Rows are free while thinking; once the end token is among the outputs the matcher
    governs the tokens after it, catching up and rolling back as without thinking."""
    end, vocab = 513, 640
    compiler = XGrammarCompiler(think_checkpoint, vocab, [1])
    constraint = StructuredOutput(GuideKind.REGEX, "ab", after_token_id=end)
    params = SamplingParams(structured_output=compiler.compile(constraint))
    tokenizer = Tokenizer.from_pretrained(think_checkpoint)
    (a,), (b,) = tokenizer.encode("a", False), tokenizer.encode("b", False)
    thought = tokenizer.encode("hmm", False)

    def sequence(outputs: list[int]) -> ScheduledSequence:
        all_ids = [5, 6, *outputs]
        return ScheduledSequence("r", all_ids[-1:], len(all_ids) - 1, [0], True, params, all_ids, 2)

    matchers = GrammarMatchers(vocab)
    assert matchers.fill_mask([sequence(thought)]) is None
    matchers.accept([sequence(thought)], [end])
    assert len(matchers) == 0  # nothing accepted while thinking
    first = allowed(matchers.fill_mask([sequence([*thought, end])]), vocab)
    assert a in first and b not in first and end not in first
    matchers.accept([sequence([*thought, end])], [a])
    assert allowed(matchers.fill_mask([sequence([*thought, end, a])]), vocab) == {b}
    # Re-run of the step after "a" was accepted: rolled back, not accepted twice.
    assert allowed(matchers.fill_mask([sequence([*thought, end])]), vocab) == first


def allowed(mask: GrammarMask | None, vocab: int) -> set[int]:
    assert mask is not None
    logits = mask.apply(torch.zeros(1, vocab))[0]
    return set((logits > float("-inf")).nonzero().flatten().tolist())
