"""The shipped demo model: small enough to commit, the CLI's default, and it answers in words."""

from __future__ import annotations

import re
from functools import cache

import pytest

from baton.app.cli import build_parser
from baton.app.model_settings import DEMO_MODEL, DEMO_MODEL_NAME, ModelSettings
from baton.app.model_source import resolve_model
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.request import FinishReason
from baton.core.sampling_params import SamplingParams

PROMPTS = [
    "What is the with statement?",
    "Explain exceptions.",
    "What is the json module?",
    "What does os.path.join() do?",
]


@cache
def corpus_words() -> frozenset[str]:
    """Every word of the text the demo model was trained on."""
    from baton.tools.train_demo import docstring_sections, is_validation, topic_sections

    sections = topic_sections() + docstring_sections()
    text = " ".join(s.text for s in sections if not is_validation(s))
    return frozenset(words(text))


def words(text: str) -> list[str]:
    """Lower-case words with their surrounding punctuation stripped; symbols and numbers dropped."""
    stripped = (w.strip("\"'`“”‘’()[]{}<>.,:;!?*-=") for w in text.lower().split())
    return [w for w in stripped if re.search("[a-z]", w)]


@pytest.fixture(scope="module")
def demo_llm():
    from baton.app.llm import LLM

    return LLM(DEMO_MODEL, device="cpu")


def test_demo_checkpoint_fits_in_ten_megabytes():
    files = [f for f in DEMO_MODEL.iterdir() if f.is_file()]
    names = {f.name for f in files}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert sum(f.stat().st_size for f in files) <= 10 * 1000 * 1000


def test_serve_and_generate_default_to_the_demo_model():
    parser = build_parser()
    assert parser.parse_args(["serve"]).model == str(DEMO_MODEL)
    assert parser.parse_args(["generate", "--prompt", "hi"]).model == str(DEMO_MODEL)
    assert resolve_model(ModelSettings()).name == DEMO_MODEL_NAME == "baton-demo"


def test_a_folder_is_served_under_its_own_name(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()

    source = resolve_model(ModelSettings(model=str(folder)))

    assert (source.folder, source.name) == (folder, "my-model")
    assert str(folder) in source.origin


def test_demo_model_is_a_llama_whose_template_ends_on_eos(demo_llm):
    config = ModelConfig.from_pretrained(DEMO_MODEL)
    tokenizer = demo_llm.tokenizer
    assert config.architecture == "LlamaForCausalLM"
    assert config.eos_token_ids == [tokenizer.eos_token_id]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|assistant|>\n")
    history = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        add_generation_prompt=False,
    )
    assert history.endswith("Hello" + tokenizer.id_to_token(tokenizer.eos_token_id) + "\n")


def test_greedy_chat_answers_in_words_and_stops_at_the_end_token(demo_llm):
    params = SamplingParams(max_tokens=256, temperature=0)
    prompts = [demo_llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    results = demo_llm.generate(prompts, params)
    vocabulary = corpus_words()
    for prompt, result in zip(PROMPTS, results, strict=True):
        answer = words(result.text)
        assert len(answer) >= 5, (prompt, result.text)
        known = sum(w in vocabulary for w in answer) / len(answer)
        assert known >= 0.8, (prompt, known, result.text)
    assert any(r.finish_reason == FinishReason.STOP for r in results), [r.text for r in results]
