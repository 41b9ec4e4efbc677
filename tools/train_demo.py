"""Train Baton's demo model: a small Llama chat model on Python's own documentation, offline.

The corpus ships with CPython under the PSF license: the help topics of `pydoc_data` and the
docstrings of the standard library's modules, classes and functions. Each section becomes chat
samples (a question about it, its opening text as the answer) and plain text. The tokenizer is
`baton.tools.tokenizer_trainer`'s, trained on the training sections; the model is a transformers
`LlamaForCausalLM`. The run is deterministic for a given seed, thread count and Python version.

    python -m baton.tools.train_demo --out app/demo_model --steps 1000 --max-minutes 40
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import re
import sysconfig
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from baton.tools.tokenizer_trainer import BOS, EOS, train_tokenizer

ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
MAX_ANSWER_CHARS = 600
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are Baton's demo model. You answer questions about Python.",
    "Answer briefly.",
]
# Sections of stdlib source that are tests or demos, not documentation.
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "turtledemo", "lib2to3"}
HEADING_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")
DOCSTRING_KINDS = {
    "all": ("module", "class", "function"),
    "modules": ("module",),
    "none": (),
}


@dataclass(slots=True)
class Section:
    """One piece of documentation: what it is called and its text."""

    name: str
    kind: str  # "topic", "module", "class" or "function"
    text: str


@dataclass(slots=True)
class Sample:
    """A training sample: chat messages, or plain text when `messages` is empty."""

    messages: list[dict[str, str]]
    text: str = ""


def topic_sections() -> list[Section]:
    """The `pydoc_data` help topics, split at their headings."""
    from pydoc_data.topics import topics

    sections = []
    for key in sorted(topics):
        title, body = "", []
        lines = topics[key].splitlines()
        for i, line in enumerate(lines):
            if HEADING_UNDERLINE.match(line.strip()):
                continue
            if i + 1 < len(lines) and HEADING_UNDERLINE.match(lines[i + 1].strip()):
                if title and "".join(body).strip():
                    sections.append(Section(title, "topic", "\n".join(body).strip()))
                title, body = line.strip(), []
                continue
            body.append(line)
        if title and "".join(body).strip():
            sections.append(Section(title, "topic", "\n".join(body).strip()))
    return sections


def docstring_sections() -> list[Section]:
    """Docstrings of the standard library's public modules, classes and functions, parsed from
    source (nothing is imported)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    sections = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if SKIPPED_DIRS.intersection(parts) or any(p.startswith("_") for p in parts[:-1]):
            continue
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module.split(".")[-1].startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        sections.extend(_docstrings(tree, module, "module"))
    return sections


def _docstrings(node: ast.AST, name: str, kind: str) -> list[Section]:
    found = []
    doc = ast.get_docstring(node)  # type: ignore[arg-type]
    if doc and len(doc) >= 80:
        found.append(Section(name, kind, doc.strip()))
    for child in getattr(node, "body", []):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if child.name.startswith("_"):
                continue
            child_kind = "class" if isinstance(child, ast.ClassDef) else "function"
            found.extend(_docstrings(child, f"{name}.{child.name}", child_kind))
    return found


def answer_text(text: str) -> str:
    """The opening paragraphs of `text`, up to about `MAX_ANSWER_CHARS`."""
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
    answer = paragraphs[0]
    for paragraph in paragraphs[1:]:
        if len(answer) + len(paragraph) + 2 > MAX_ANSWER_CHARS:
            break
        answer += "\n\n" + paragraph
    if len(answer) > MAX_ANSWER_CHARS + 200:
        cut = answer.rfind(". ", 0, MAX_ANSWER_CHARS + 200)
        answer = answer[: cut + 1] if cut > 0 else answer[:MAX_ANSWER_CHARS]
    return answer


def questions(section: Section) -> list[str]:
    """Ways a user might ask for `section`."""
    name = section.name
    if section.kind == "module":
        return [f"What is the {name} module?", f"Tell me about the {name} module."]
    if section.kind == "class":
        return [f"What is {name}?", f"Tell me about the {name} class."]
    if section.kind == "function":
        return [f"What does {name}() do?", f"Explain {name}."]
    title = name[:1].lower() + name[1:] if name.startswith("The ") else name
    plain = title.replace('"', "")
    return [
        f"What is {title}?",
        f"Tell me about {plain}.",
        f"Explain {plain}.",
        f"How does {plain} work in Python?",
    ]


def build_samples(
    sections: list[Section], rng: random.Random, questions_per_section: int
) -> list[Sample]:
    """Chat samples (up to `questions_per_section` per section, some with a system prompt) and
    plain text."""
    samples = []
    for section in sections:
        answer = answer_text(section.text)
        asked = questions(section)
        for question in rng.sample(asked, min(questions_per_section, len(asked))):
            messages = [{"role": "user", "content": question}]
            if rng.random() < 0.2:
                messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
            messages.append({"role": "assistant", "content": answer})
            samples.append(Sample(messages))
        samples.append(Sample([], section.text))
    rng.shuffle(samples)
    return samples


def is_validation(section: Section) -> bool:
    """A stable 1-in-20 of the docstrings is held out; every help topic is trained on."""
    return section.kind != "topic" and zlib.crc32(section.name.encode()) % 20 == 0


def encode(samples: list[Sample], tokenizer) -> torch.Tensor:
    """All samples as one token stream: chats through the chat template, text between BOS/EOS."""
    ids: list[int] = []
    for sample in samples:
        if sample.messages:
            text = tokenizer.apply_chat_template(sample.messages, tokenize=False)
        else:
            text = BOS + sample.text + EOS
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
    return torch.tensor(ids, dtype=torch.long)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def validation_loss(model, stream: torch.Tensor, seq_len: int, windows: int) -> float:
    model.eval()
    starts = torch.linspace(0, len(stream) - seq_len - 1, windows).long()
    batch = torch.stack([stream[s : s + seq_len] for s in starts])
    loss = model(input_ids=batch, labels=batch).loss.item()
    model.train()
    return loss


def save(model, tokenizer, out: Path) -> None:
    """Write the checkpoint in float16 (half the bytes; Baton's CPU path loads it as float32)."""
    import copy

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        half = copy.deepcopy(model).to(torch.float16)
        half.generation_config.eos_token_id = tokenizer.eos_token_id
        half.generation_config.bos_token_id = tokenizer.bos_token_id
        half.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for file in Path(tmp).iterdir():
            file.chmod(0o644)
            file.replace(out / file.name)


def sample_reply(model, tokenizer, question: str, max_new_tokens: int = 48) -> str:
    model.eval()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id
        )
    model.train()
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--max-minutes", type=float, default=40.0, help="stop early after this")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument(
        "--docstrings",
        choices=sorted(DOCSTRING_KINDS),
        default="all",
        help="which stdlib docstrings join the help topics in the corpus",
    )
    parser.add_argument("--questions", type=int, default=2, help="chat samples per section")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--intermediate-size", type=int, default=704)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    train(args)


def train(args: argparse.Namespace) -> None:
    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    sections = topic_sections() + docstring_sections()
    # The validation set is the same whichever docstrings are trained on, so runs compare.
    trained_kinds = ("topic", *DOCSTRING_KINDS[args.docstrings])
    train_sections = [s for s in sections if s.kind in trained_kinds and not is_validation(s)]
    val_sections = [s for s in sections if is_validation(s)]
    tokenizer = train_tokenizer(
        args.vocab_size,
        [s.text for s in train_sections],
        role_tokens=ROLE_TOKENS,
        prepend_bos=False,
    )
    train_stream = encode(build_samples(train_sections, rng, args.questions), tokenizer)
    val_stream = encode(build_samples(val_sections, rng, args.questions), tokenizer)
    print(
        f"corpus: {len(train_sections)} train sections ({len(train_stream)} tokens), "
        f"{len(val_sections)} validation sections ({len(val_stream)} tokens)",
        flush=True,
    )
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
    )
    model = transformers.LlamaForCausalLM(config)
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    batches = torch.Generator().manual_seed(args.seed)
    start, best, recent = time.monotonic(), float("inf"), []
    history = []
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        starts = torch.randint(
            0, len(train_stream) - args.seq_len, (args.batch_size,), generator=batches
        )
        batch = torch.stack([train_stream[s : s + args.seq_len] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent.append(loss.item())
        minutes = (time.monotonic() - start) / 60
        last = step + 1 == args.steps or minutes >= args.max_minutes
        if (step + 1) % args.eval_every == 0 or last:
            val = validation_loss(model, val_stream, args.seq_len, 32)
            train_loss = sum(recent) / len(recent)
            recent = []
            history.append(
                {"step": step + 1, "minutes": round(minutes, 1), "train": train_loss, "val": val}
            )
            print(
                f"step {step + 1}: train {train_loss:.3f} val {val:.3f} "
                f"lr {optimizer.param_groups[0]['lr']:.2e} {minutes:.1f} min",
                flush=True,
            )
            best = min(best, val)
            # The latest weights, not the best on validation: the validation docstrings are not
            # what the demo is asked about, and answers keep improving as training memorizes
            # the help topics. Saving at every evaluation means an early stop still ships one.
            save(model, tokenizer, Path(args.out))
            print(
                "  sample:",
                repr(sample_reply(model, tokenizer, "What is the with statement?")),
                flush=True,
            )
        if last:
            break
    print(json.dumps({"best_val": best, "history": history}), flush=True)


if __name__ == "__main__":
    main()
