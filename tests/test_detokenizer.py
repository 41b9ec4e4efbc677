"""baton.core.text.detokenizer: streamed deltas add up to the full decode, and never split a
character."""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as BackendTokenizer

from baton.core.text.detokenizer import MAX_HELD_TOKENS, WINDOW_TOKENS, IncrementalDetokenizer
from baton.core.text.tokenizer import Tokenizer

TEXTS = [
    "Hello, world! This is a plain ASCII sentence.",
    "  two leading spaces,\ttabs\nand\n\nnew lines  ",
    "accents: héllo naïve café Ünïcödé — “quotes”",
    "CJK: 中文字符 日本語のテキスト 한국어",
    "emoji: 😀 👍🏽 👨‍👩‍👧 🇺🇳 🫠",
    "combining e\u0301 and zero\u200bwidth joiners",
    "code:\n    def f(x):\n        return x ** 2  # 平方",
    "🙂" * 20 + "x" + "中" * 20,
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, hf_tokenizer) -> Tokenizer:
    out = tmp_path_factory.mktemp("tokenizer")
    hf_tokenizer.save_pretrained(out)
    return Tokenizer.from_pretrained(out)


def stream(
    tokenizer: Tokenizer, ids: list[int], prompt: list[int] = (), skip: bool = True
) -> tuple[list[str], str]:
    """Every delta `add` returned, and what `flush` returned at the end."""
    detokenizer = IncrementalDetokenizer(tokenizer, list(prompt), skip_special_tokens=skip)
    pieces = [detokenizer.add(token_id) for token_id in ids]
    tail = detokenizer.flush()
    assert detokenizer.text == "".join(pieces) + tail
    return pieces, tail


def sentencepiece_style_tokenizer() -> Tokenizer:
    """A Llama-2-like tokenizer: '▁' for spaces, byte fallback, a decoder that strips the
    leading space of a decode. Hand-made, so it needs no training."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in "▁" + string.ascii_letters + string.digits + ".,!?'":
        vocab[piece] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "a"), ("i", "n"), ("▁", "w")]
    vocab.update({a + b: len(vocab) + i for i, (a, b) in enumerate(merges)})
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    backend = BackendTokenizer(model)
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return Tokenizer(backend, {"bos_token": "<s>", "eos_token": "</s>"}, {})


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_full_decode_and_never_splits_a_character(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, tail = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert tail == ""
    assert not any("\ufffd" in piece for piece in pieces)


def test_multibyte_character_is_held_until_its_last_byte(tokenizer):
    ids = tokenizer.encode("a中", add_special_tokens=False)
    assert len(ids) == 4, "the premise: 中 is three byte tokens in the tiny vocabulary"
    pieces, _ = stream(tokenizer, ids)
    assert pieces == ["a", "", "", "中"]


def test_flush_releases_an_unfinished_character_as_replacement(tokenizer):
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]
    pieces, tail = stream(tokenizer, ids)
    assert "".join(pieces) == "ok "
    assert tail == "\ufffd" == tokenizer.decode(ids)[-1]


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_follow_skip_special_tokens(tokenizer, skip):
    text_ids = tokenizer.encode(" fin 中文", add_special_tokens=False)
    ids = [0, *text_ids[:3], 1, *text_ids[3:5], 2, 2, *text_ids[5:], 1]
    pieces, tail = stream(tokenizer, ids, skip=skip)
    assert "".join(pieces) + tail == tokenizer.decode(ids, skip_special_tokens=skip)
    assert ("<|end|>" in "".join(pieces)) is not skip


@pytest.mark.parametrize(
    ("prompt", "output"),
    [
        ("The quick brown", " fox jumps over the lazy dog"),
        ("Say it in Chinese:", " 中文, then 😀."),
        ("ends in a new line\n", "  indented"),
        ("", "no prompt at all"),
        ("中", "文"),
    ],
)
def test_continuation_after_prompt_equals_difference_of_decodes(tokenizer, prompt, output):
    prompt_ids = tokenizer.encode(prompt)
    output_ids = tokenizer.encode(output, add_special_tokens=False)
    pieces, tail = stream(tokenizer, output_ids, prompt_ids)
    whole = tokenizer.decode(prompt_ids + output_ids)
    assert "".join(pieces) + tail == whole[len(tokenizer.decode(prompt_ids)) :] == output
    assert tail == ""


def test_continuation_after_a_chat_prompt(tokenizer):
    prompt_ids = tokenizer.encode_chat([{"role": "user", "content": "Bonjour ?"}])
    output_ids = tokenizer.encode(" Très bien, merci ! 🇫🇷", add_special_tokens=False)
    pieces, _ = stream(tokenizer, [*output_ids, tokenizer.eos_token_id], prompt_ids)
    assert "".join(pieces) == " Très bien, merci ! 🇫🇷"


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.characters(codec="utf-8"), max_size=60), cut=st.integers(0, 60))
def test_any_text_streams_exactly_with_or_without_a_prompt(tokenizer, text, cut):
    assume("\ufffd" not in text)
    prompt_ids = tokenizer.encode(text[:cut])
    output_ids = tokenizer.encode(text[cut:], add_special_tokens=False)
    for prompt in ([], prompt_ids):
        pieces, tail = stream(tokenizer, output_ids, prompt)
        assert "".join(pieces) == text[cut:]
        assert tail == ""
        assert not any("\ufffd" in piece for piece in pieces)


# Kept under MAX_HELD_TOKENS (prompt context included), past which invalid bytes are
# released early by design.
@settings(max_examples=300, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 511), max_size=6),
    ids=st.lists(st.integers(0, 511), max_size=MAX_HELD_TOKENS - 8),
    skip=st.booleans(),
)
def test_any_ids_stream_exactly_even_invalid_utf8(tokenizer, prompt, ids, skip):
    pieces, tail = stream(tokenizer, ids, prompt, skip)
    prompt_text = tokenizer.decode(prompt, skip)
    # Bytes left dangling by the prompt belong to the character the output completes.
    settled = len(prompt_text.rstrip("\ufffd"))
    assert "".join(pieces) + tail == tokenizer.decode(prompt + ids, skip)[settled:]


class CountingTokenizer(Tokenizer):
    """Records how many ids each decode call was given."""

    def __init__(self, inner: Tokenizer) -> None:
        self.__dict__.update(inner.__dict__)
        self.decode_lengths: list[int] = []

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decode_lengths.append(len(token_ids))
        return super().decode(token_ids, skip_special_tokens)


def test_each_step_decodes_a_short_window_however_long_the_output(tokenizer):
    counting = CountingTokenizer(tokenizer)
    prompt = tokenizer.encode("A long prompt, ending on a whole character. " * 50)
    ids = tokenizer.encode(" ".join(TEXTS) * 20, add_special_tokens=False)
    pieces, _ = stream(counting, ids, prompt)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert len(ids) > 2000
    assert max(counting.decode_lengths) <= WINDOW_TOKENS + 8
    assert len(counting.decode_lengths) < 1.2 * len(ids)


def test_endless_invalid_bytes_keep_the_window_bounded(tokenizer):
    counting = CountingTokenizer(tokenizer)
    lead_byte = tokenizer.encode("中", add_special_tokens=False)[0]
    pieces, tail = stream(counting, [lead_byte] * 1000)
    assert "".join(pieces) + tail == "\ufffd" * 1000
    # Released every MAX_HELD_TOKENS, cut back at the release before: twice that at most.
    assert max(counting.decode_lengths) <= 2 * (MAX_HELD_TOKENS + 1)


@pytest.mark.parametrize("text", [*TEXTS, "the the the", "a  b   c", " leading"])
def test_sentencepiece_style_spaces_and_byte_fallback(text):
    tokenizer = sentencepiece_style_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, tail = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert tail == ""
    assert not any("\ufffd" in piece for piece in pieces)


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.sampled_from(["the", "a", "in", "wé", "中文", "😀", "", "</s>"]), max_size=30)
)
def test_sentencepiece_style_continuation_keeps_leading_spaces(words):
    tokenizer = sentencepiece_style_tokenizer()
    half = len(words) // 2
    prompt_ids = tokenizer.encode(" ".join(words[:half]))
    output_ids = tokenizer.encode(" " + " ".join(words[half:]), add_special_tokens=False)
    pieces, tail = stream(tokenizer, output_ids, prompt_ids)
    whole = tokenizer.decode(prompt_ids + output_ids)
    assert "".join(pieces) + tail == whole[len(tokenizer.decode(prompt_ids)) :]
    assert not any("\ufffd" in piece for piece in pieces)
