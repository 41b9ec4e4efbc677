"""A checkpoint's tokenizer and chat template, read with `tokenizers` and `jinja2` only.

Loads `tokenizer.json` plus `tokenizer_config.json` from a Hugging Face checkpoint folder and
renders chat templates the way transformers does, so a prompt tokenizes to the same ids here as
with `AutoTokenizer`.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer


class ChatTemplateError(ValueError):
    """A chat prompt could not be rendered; the message says what to change."""


class NoChatTemplateError(ChatTemplateError):
    """The checkpoint ships no chat template, so only raw-prompt completions can be served."""


class Tokenizer:
    """Text ↔ token ids, special tokens and the chat template of one checkpoint."""

    def __init__(
        self,
        backend: BackendTokenizer,
        special_tokens: dict[str, str],
        chat_templates: dict[str, str],
        extra_special_tokens: list[str] | None = None,
        name: str = "tokenizer",
    ) -> None:
        self.backend = backend
        # Named special tokens (`bos_token`, ...) are also the template's variables.
        self.special_tokens = special_tokens
        self.chat_templates = chat_templates
        self.name = name
        self._compiled: dict[str, jinja2.Template] = {}
        self._ensure_special([*special_tokens.values(), *(extra_special_tokens or [])])
        self.bos_token_id = self.token_to_id(special_tokens.get("bos_token"))
        self.eos_token_id = self.token_to_id(special_tokens.get("eos_token"))
        self.pad_token_id = self.token_to_id(special_tokens.get("pad_token"))
        added = backend.get_added_tokens_decoder()
        self.all_special_ids: frozenset[int] = frozenset(
            token_id for token_id, token in added.items() if token.special
        )
        # Every added token's text, special or not (`<think>` usually is not).
        self.added_tokens: dict[int, str] = {i: token.content for i, token in added.items()}

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer:
        """Load `tokenizer.json`, `tokenizer_config.json` and the chat template from `path`."""
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in {path}: Baton reads fast tokenizers only; save one with "
                "transformers' AutoTokenizer.from_pretrained(...).save_pretrained(folder)"
            )
        config = _read_json(path / "tokenizer_config.json")
        # Older checkpoints keep the special tokens in a separate file; the config wins on conflict.
        config = {**_read_json(path / "special_tokens_map.json"), **config}
        backend = BackendTokenizer.from_file(str(tokenizer_file))
        named, extra = _special_tokens(config)
        return cls(backend, named, _chat_templates(path, config), extra, path.name)

    def with_chat_template(self, template: str, origin: str) -> Tokenizer:
        """This tokenizer with `template` as its one chat template, with or without tools (as
        vLLM's --chat-template replaces the checkpoint's). Compiled now, so a broken template
        fails where it is given rather than at the first chat; `origin` names it in that error.
        Raises ChatTemplateError."""
        compiled = compile_chat_template(template, origin, "fix it")
        templates = {"default": template}
        tokenizer = Tokenizer(self.backend, self.special_tokens, templates, [], self.name)
        tokenizer._compiled["default"] = compiled
        return tokenizer

    def _ensure_special(self, tokens: list[str]) -> None:
        # transformers registers every declared special token with the backend as special, even
        # when tokenizer.json lists it as a plain token; without this, decode would not skip it.
        added = {t.content for t in self.backend.get_added_tokens_decoder().values() if t.special}
        missing = [t for t in dict.fromkeys(tokens) if t not in added]
        if missing:
            self.backend.add_special_tokens(
                [AddedToken(t, special=True, normalized=False) for t in missing]
            )

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (the model's embedding may be larger)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (a byte-level vocabulary spells a byte as
        a character, so this bounds the decoded text too)."""
        return max(len(token) for token in self.backend.get_vocab(with_added_tokens=True))

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str | None]:
        return [self.backend.id_to_token(i) for i in token_ids]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` applies the post-processor (e.g. BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `token_ids`. No `clean_up_tokenization_spaces`: transformers skips it for BPE."""
        return self.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> str:
        """Render `messages` with the checkpoint's chat template, as transformers'
        `apply_chat_template(..., tokenize=False)` does.

        `extra` become template variables (`tools`, `documents`, `enable_thinking`, ...) and
        override the special-token variables (`bos_token`, ...). The rendered text already holds
        the template's special tokens, so encode it with `add_special_tokens=False` (as
        `encode_chat` does); encoding it with the default would add a second BOS.
        `continue_final_message` ends the text where the last message's content ends, so the
        model carries on writing that message (a prefilled answer) instead of closing it.
        Raises `NoChatTemplateError` or `ChatTemplateError` (both `ValueError`s).
        """
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message continues the last message, and add_generation_prompt "
                "opens a new one; send add_generation_prompt: false with it"
            )
        template = self._compiled_template(extra.get("tools") is not None)
        # OpenAI clients send `"content": null` and `"tool_calls": null`; templates test for a
        # missing key, not for None, so transformers drops such keys and so do we.
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        variables = {"tools": None, "documents": None, **self.special_tokens, **extra}
        try:
            text = template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **variables
            )
        # The template is foreign code: whatever it raises means these messages do not fit it.
        except Exception as exc:
            raise ChatTemplateError(
                f"the chat template of {self.name} rejected these messages ({exc}); check the "
                "roles and their order the model expects, or send a raw prompt to /v1/completions"
            ) from exc
        if continue_final_message:
            return _cut_after_final_message(text, messages[-1].get("content"))
        return text

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **extra: Any,
    ) -> list[int]:
        """Prompt ids for a chat: the rendered template encoded without adding special tokens."""
        text = self.apply_chat_template(
            messages, add_generation_prompt, continue_final_message, **extra
        )
        return self.encode(text, add_special_tokens=False)

    def _compiled_template(self, with_tools: bool) -> jinja2.Template:
        if not self.chat_templates:
            raise NoChatTemplateError(
                f"{self.name} has no chat template (no `chat_template` in tokenizer_config.json "
                "and no chat_template.jinja); send a raw prompt to /v1/completions, or add a "
                "template to the checkpoint or give one with --chat-template"
            )
        name = "tool_use" if with_tools and "tool_use" in self.chat_templates else "default"
        if name not in self.chat_templates:
            raise ChatTemplateError(
                f"{self.name} has named chat templates {sorted(self.chat_templates)} but none "
                "called 'default'; rename the one to use to 'default' in tokenizer_config.json"
            )
        # Compiled on first use, so a broken template fails only the requests that need it.
        if name not in self._compiled:
            self._compiled[name] = compile_chat_template(
                self.chat_templates[name],
                f"{name!r} of {self.name}",
                "fix it in the checkpoint's tokenizer_config.json or chat_template.jinja",
            )
        return self._compiled[name]


def _cut_after_final_message(text: str, content: object) -> str:
    """`text` up to the end of the final message's content, where the template wrote it last.
    Templates often strip a message; then the cut falls where its stripped text ends."""
    if not isinstance(content, str) or not content.strip():
        raise ChatTemplateError(
            "continue_final_message needs a final message with text content to continue"
        )
    stripped = content.strip()
    start = text.rfind(stripped)
    if start < 0:
        raise ChatTemplateError(
            "continue_final_message: the chat template does not write the final message's "
            "content as sent, so there is no place to continue it from; leave it out"
        )
    # Trailing spaces the template kept are part of what the model continues after.
    kept = content.lstrip()
    if text.startswith(kept, start):
        return text[: start + len(kept)]
    return text[: start + len(stripped)]


def compile_chat_template(template: str, origin: str, fix: str) -> jinja2.Template:
    """`template` compiled as transformers compiles chat templates. Raises ChatTemplateError
    naming `origin` (where the template came from), the line, and `fix` (what to do)."""
    try:
        return _template_environment().from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(
            f"the chat template {origin} is not valid Jinja (line {exc.lineno}: {exc.message}); "
            f"{fix}"
        ) from exc


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks;
    serving only needs the text, so the block renders its body unchanged."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


@cache
def _template_environment() -> ImmutableSandboxedEnvironment:
    """A sandbox set up as transformers sets up its own, so templates render identically."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson sorts keys and HTML-escapes `<>&'`, which would change tool schemas
    # the model was trained on; templates expect plain json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_content(value: Any) -> str | None:
    """A special token as written in the config: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Named special tokens (the standard ones and model-specific `*_token` keys like
    `image_token`), and the unnamed extras that are special for decoding only."""
    named: dict[str, str] = {}
    for key, value in config.items():
        content = _token_content(value)
        if content is not None and key.endswith("_token"):
            named[key] = content
    extras = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    if isinstance(extras, dict):
        named.update((k, c) for k, v in extras.items() if (c := _token_content(v)) is not None)
        return named, []
    return named, [c for v in extras if (c := _token_content(v)) is not None]


def _chat_templates(path: Path, config: dict[str, Any]) -> dict[str, str]:
    """Templates by name; the files transformers saves (`chat_template.jinja` for the default,
    `additional_chat_templates/NAME.jinja` for the others) win over the config, as there."""
    raw = config.get("chat_template")
    templates: dict[str, str] = {}
    if isinstance(raw, str):
        templates["default"] = raw
    elif isinstance(raw, list):
        templates.update((t["name"], t["template"]) for t in raw)
    named_dir = path / "additional_chat_templates"
    if named_dir.is_dir():
        for file in sorted(named_dir.glob("*.jinja")):
            templates[file.stem] = file.read_text(encoding="utf-8")
    default_file = path / "chat_template.jinja"
    if default_file.is_file():
        templates["default"] = default_file.read_text(encoding="utf-8")
    return templates
