"""`baton generate`: run the engine offline on a checkpoint, no server; one prompt streams its
text as it is generated, several print each answer whole."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from baton.app.model_settings import ModelSettings
from baton.app.model_source import resolve_model
from baton.core.config import EngineConfig
from baton.core.sampling_params import SamplingParams
from baton.core.setting import setting


@dataclass(frozen=True, slots=True)
class GenerateSettings:
    """The prompts `baton generate` answers."""

    prompt: list[str] = setting(
        default_factory=list, repeatable=True, required=True, help="prompt (repeatable)"
    )
    chat: bool = setting(False, help="wrap prompts in the chat template")


def generate(
    model: ModelSettings,
    config: EngineConfig,
    settings: GenerateSettings,
    params: SamplingParams,
) -> int:
    from baton.app.llm import LLM  # torch loads here, not with the CLI

    llm = LLM(
        resolve_model(model).folder,
        device=model.device,
        dtype=model.dtype,
        load_format=model.load_format,
        config=config,
    )
    prompts = (
        [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in settings.prompt]
        if settings.chat
        else settings.prompt
    )
    stream = len(prompts) == 1

    def show(output):
        if stream:
            sys.stdout.write(output.new_text)
            sys.stdout.flush()

    start = time.perf_counter()
    results = llm.generate(prompts, params, on_output=show)
    elapsed = time.perf_counter() - start
    for result in results:
        if not stream:
            print(f"--- {result.request_id}\n{result.text}")
        if result.error:
            print(f"\nerror: {result.error}", file=sys.stderr)
    num_tokens = sum(len(r.token_ids) for r in results)
    print(
        f"\n[{num_tokens} tokens in {elapsed:.2f} s, {num_tokens / elapsed:.1f} tokens/s, "
        f"finish: {', '.join(str(r.finish_reason.value) for r in results)}]",
        file=sys.stderr,
    )
    return 0
