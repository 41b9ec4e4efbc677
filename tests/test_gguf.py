"""GGUF files as `--model`: files llama.cpp's own tools made from tiny random checkpoints
(scripts/make_gguf_fixtures.py, tests/data/gguf/fixtures.json) load with their config, tokenizer
and chat template; F32 serves exactly what the source checkpoint does, the half-precision and
quantized files within a measured log-probability tolerance of it; a folder holding one, the
conversion cache, the errors, and a real `baton serve` of one."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from baton.app.llm import LLM
from baton.app.model_settings import ModelSettings
from baton.app.model_source import ModelSource, resolve_model
from baton.core.checkpoint.checkpoint_check import CheckpointFormatError
from baton.core.sampling_params import SamplingParams
from baton.core.text.tokenizer import Tokenizer
from baton.gpu.models.quantization import Int8Linear
from baton.kernels.cpu_extension import cpu_kernels_available
from tests.server_harness import free_port, wait_until_healthy
from tests.test_greedy_vs_transformers import (
    NUM_NEW_TOKENS,
    assert_same_or_near_tie,
    random_prompts,
    transformers_greedy,
)

FIXTURES = Path(__file__).parent / "data" / "gguf"
MANIFEST = json.loads((FIXTURES / "fixtures.json").read_text())
# Each file's tensor types, as llama.cpp wrote them: Q4_K_M puts Q6_K where it matters most, and
# Q4_0 gives the output Q6_K, which rows of 64 cannot hold, so Q8_0.
TENSOR_TYPES = {
    "tiny-f32.gguf": {"F32"},
    "tiny-f16.gguf": {"F16", "F32"},
    "tiny-bf16.gguf": {"BF16", "F32"},
    "tiny-q8_0.gguf": {"Q8_0", "F32"},
    "tiny-q4_0.gguf": {"Q4_0", "Q8_0", "F32"},
    "wide-q4_k_m.gguf": {"Q4_K", "Q6_K", "F32"},
}
# The largest relative error (Frobenius) of a dequantized weight against the source's, by type:
# what each format's block scales allow on Gaussian weights, with margin.
WEIGHT_ERROR = {"Q8_0": 0.008, "Q6_K": 0.025, "Q4_K": 0.09, "Q4_0": 0.11}
# llama.cpp's tensor names -> the checkpoint's, for a Llama.
GGUF_NAMES = {
    "token_embd": "model.embed_tokens",
    "output": "lm_head",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# The mean and the largest gap between a prompt token's log-probability under a file and under
# its float32 source checkpoint, over SCORED_PROMPT_LENGTHS (measured, with about 2x margin).
# Random weights are harder on 4 bits than trained ones: their gaps are wide.
TOLERANCE = {
    "tiny-f16.gguf": (0.001, 0.005),
    "tiny-bf16.gguf": (0.01, 0.05),
    "tiny-q8_0.gguf": (0.025, 0.1),
    "tiny-q4_0.gguf": (0.3, 1.5),
    "wide-q4_k_m.gguf": (0.5, 2.5),
}
# Q8_0 under --quantization int8: its dequantized weights quantized again, per channel.
INT8_TOLERANCE = (0.03, 0.12)
SCORED_PROMPT_LENGTHS = (16, 64, 200)
SCORED = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=1)


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    """BATON_CACHE for the module: each fixture converted once, into a folder of the test's."""
    folder = tmp_path_factory.mktemp("baton-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BATON_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def sources(make_checkpoint) -> dict[str, Path]:
    """The checkpoints the fixtures were made from, made again from their seeds."""
    made = {}
    for name, spec in MANIFEST["sources"].items():
        assert spec["seed"] == 0 and spec["preset"] == "tiny"  # what make_checkpoint makes
        made[name] = make_checkpoint(spec["family"], **spec["overrides"])
    return made


def source_of(file: str, sources: dict[str, Path]) -> Path:
    return sources[MANIFEST["files"][file]["source"]]


def resolved(file: str) -> ModelSource:
    return resolve_model(ModelSettings(model=str(FIXTURES / file)))


def serve(model: Path | str, **config) -> LLM:
    return LLM(model, device="cpu", num_kv_blocks=64, **config)


def prompt_logprobs(llm: LLM) -> torch.Tensor:
    """Every prompt token's log-probability, over prompts of SCORED_PROMPT_LENGTHS."""
    results = llm.generate(random_prompts(512, SCORED_PROMPT_LENGTHS), SCORED)
    return torch.tensor([e.logprob for r in results for e in r.prompt_logprobs[1:]])


@pytest.fixture(scope="module")
def source_logprobs(sources) -> dict[str, torch.Tensor]:
    """`prompt_logprobs` of each source checkpoint, served as it is."""
    return {name: prompt_logprobs(serve(folder)) for name, folder in sources.items()}


def tensor_types(file: str) -> dict[str, str]:
    """The file's tensor types by the checkpoint's tensor names."""
    from gguf import GGUFReader

    types = {}
    for tensor in GGUFReader(FIXTURES / file).tensors:
        base, _, _ = tensor.name.rpartition(".")
        block, _, kind = base.rpartition(".")
        name = GGUF_NAMES.get(kind, kind)
        if block:
            name = f"model.layers.{block.split('.')[1]}.{name}"
        types[f"{name}.weight"] = tensor.tensor_type.name
    return types


def test_each_fixture_holds_the_tensor_types_llama_cpp_gives_its_type():
    assert set(MANIFEST["files"]) == set(TENSOR_TYPES)
    for file, expected in TENSOR_TYPES.items():
        assert set(tensor_types(file).values()) == expected, file


def test_the_f32_file_holds_the_source_checkpoint_exactly(sources):
    source = resolved("tiny-f32.gguf")
    ours = load_file(source.folder / "model.safetensors")
    theirs = load_file(sources["tiny"] / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        # Norms of ones are as exact in bfloat16; the rest stays float32.
        assert torch.equal(ours[name].float(), tensor), name
    config = json.loads((source.folder / "config.json").read_text())
    expected = json.loads((sources["tiny"] / "config.json").read_text())
    for key in ("architectures", "hidden_size", "num_key_value_heads", "vocab_size"):
        assert config[key] == expected[key]


@pytest.mark.parametrize("file", ["tiny-f16.gguf", "tiny-bf16.gguf"])
def test_half_precision_files_keep_their_dtype_and_every_value(sources, file):
    dtype = torch.float16 if "f16" in file and "bf16" not in file else torch.bfloat16
    ours = load_file(resolved(file).folder / "model.safetensors")
    for name, tensor in load_file(sources["tiny"] / "model.safetensors").items():
        if tensor.dim() == 2:  # the converter keeps 1-d norms in float32
            assert ours[name].dtype == dtype and torch.equal(ours[name], tensor.to(dtype)), name


def test_q8_0_weights_are_the_gguf_packages_own_round_trip(sources):
    from gguf import GGMLQuantizationType, dequantize, quantize

    q8_0 = GGMLQuantizationType.Q8_0
    ours = load_file(resolved("tiny-q8_0.gguf").folder / "model.safetensors")
    for name, tensor in load_file(sources["tiny"] / "model.safetensors").items():
        if tensor.dim() == 2:
            expected = torch.from_numpy(dequantize(quantize(tensor.numpy(), q8_0), q8_0))
            assert torch.equal(ours[name].float(), expected), name


@pytest.mark.parametrize("file", ["tiny-q4_0.gguf", "wide-q4_k_m.gguf"])
def test_quantized_weights_are_within_their_types_error_of_the_source(sources, file):
    ours = load_file(resolved(file).folder / "model.safetensors")
    source = load_file(source_of(file, sources) / "model.safetensors")
    for name, ggml_type in tensor_types(file).items():
        if ggml_type in WEIGHT_ERROR:
            error = (ours[name] - source[name]).norm() / source[name].norm()
            assert 0 < error <= WEIGHT_ERROR[ggml_type], (name, ggml_type, error)


def test_the_f32_file_serves_the_same_greedy_tokens_as_transformers(sources, source_logprobs):
    import transformers

    assert cpu_kernels_available()  # Baton's C++ CPU kernels serve it
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        sources["tiny"], dtype=torch.float32
    )
    llm = LLM(FIXTURES / "tiny-f32.gguf", device="cpu", num_kv_blocks=128)
    prompts = random_prompts(512, (1, 7, 64, 300))
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for prompt, result in zip(prompts, llm.generate(prompts, params), strict=True):
        expected = transformers_greedy(reference, prompt, NUM_NEW_TOKENS)
        assert_same_or_near_tie(reference, prompt, result.token_ids, expected)
    # The same weights through the same engine: the source folder's log-probabilities, bit for bit.
    assert torch.equal(prompt_logprobs(llm), source_logprobs["tiny"])


@pytest.mark.parametrize("file", sorted(TOLERANCE))
def test_half_precision_and_quantized_files_score_prompts_near_float32(source_logprobs, file):
    source = MANIFEST["files"][file]["source"]
    gap = (prompt_logprobs(serve(FIXTURES / file)) - source_logprobs[source]).abs()
    mean, largest = TOLERANCE[file]
    assert 0 < gap.mean() <= mean and gap.max() <= largest


def test_int8_runs_a_q8_0_file_on_the_int8_kernels(source_logprobs):
    llm = serve(FIXTURES / "tiny-q8_0.gguf", quantization="int8")
    model = llm.engine.executor.model
    assert isinstance(model.lm_head, Int8Linear)
    assert sum(isinstance(m, Int8Linear) for m in model.layers.modules()) == 8
    gap = (prompt_logprobs(llm) - source_logprobs["tiny"]).abs()
    mean, largest = INT8_TOLERANCE
    assert 0 < gap.mean() <= mean and gap.max() <= largest


def test_the_tokenizer_and_chat_template_come_from_the_metadata(sources):
    ours = Tokenizer.from_pretrained(resolved("tiny-q8_0.gguf").folder)
    theirs = Tokenizer.from_pretrained(sources["tiny"])
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Wie heißt du? 🙂  Tabs\tand\nnewlines"},
    ]
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == (
        "<|begin|><|system|>\nBe brief.<|end|>\n<|user|>\nWie heißt du? 🙂  Tabs\tand\n"
        "newlines<|end|>\n<|assistant|>\n"
    )
    assert ours.encode_chat(messages) == theirs.encode_chat(messages)
    text = "def f(x):\n    return x ** 2  # <|end|> and <|endoftext|>"
    assert ours.encode(text) == theirs.encode(text)
    # GPT-2's <|endoftext|>, which transformers adds to a byte-level vocabulary, is gone: the
    # model has no row for it.
    assert ours.vocab_size == theirs.vocab_size == 512


def test_a_folder_holding_one_gguf_serves_it_under_the_folders_name(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "model-Q8_0.gguf").symlink_to(FIXTURES / "tiny-q8_0.gguf")
    (folder / "mmproj-model-f16.gguf").write_bytes(b"GGUF")  # a vision projector, set aside
    source = resolve_model(ModelSettings(model=str(folder)))
    assert source.name == "my-model"
    assert source.folder == resolved("tiny-q8_0.gguf").folder
    assert source.origin.startswith(f"the GGUF file {folder / 'model-Q8_0.gguf'} (llama, Q8_0;")

    (folder / "model-Q4_0.gguf").symlink_to(FIXTURES / "tiny-q4_0.gguf")
    with pytest.raises(CheckpointFormatError, match="holds 2 GGUF files") as refused:
        resolve_model(ModelSettings(model=str(folder)))
    assert "(model-Q4_0.gguf, model-Q8_0.gguf); pass the one to serve" in str(refused.value)


def test_a_file_converts_once_and_again_only_when_it_changes(cache, tmp_path):
    file = tmp_path / "tiny.gguf"
    shutil.copy(FIXTURES / "tiny-q4_0.gguf", file)
    first = resolve_model(ModelSettings(model=str(file)))
    assert first.name == "tiny"
    assert first.origin == f"the GGUF file {file} (llama, Q4_0; converted into {first.folder})"
    assert first.folder.parent == cache / "gguf"
    again = resolve_model(ModelSettings(model=str(file)))
    assert again.folder == first.folder
    assert again.origin.endswith(f"(llama, Q4_0; converted before, read from {first.folder})")
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = resolve_model(ModelSettings(model=str(file)))
    assert changed.folder != first.folder and "converted into" in changed.origin
    # Nothing half-made is left beside the two conversions.
    assert sorted(p.name for p in (cache / "gguf").iterdir() if p.name.startswith(".")) == []


def test_an_architecture_transformers_cannot_read_is_refused_with_what_to_do(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    file = tmp_path / "rwkv.gguf"
    writer = GGUFWriter(file, "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointFormatError) as refused:
        resolve_model(ModelSettings(model=str(file)))
    message = str(refused.value)
    assert f"transformers cannot read {file}" in message and "rwkv6" in message
    assert "serve the model's original Hugging Face checkpoint folder instead" in message


def test_a_split_gguf_and_an_unreadable_file_are_refused(tmp_path):
    part = tmp_path / "model-00001-of-00002.gguf"
    part.symlink_to(FIXTURES / "tiny-q8_0.gguf")
    with pytest.raises(CheckpointFormatError, match="one part of a split GGUF"):
        resolve_model(ModelSettings(model=str(part)))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF")
    with pytest.raises(CheckpointFormatError, match="is not a readable GGUF file"):
        resolve_model(ModelSettings(model=str(broken)))


@pytest.mark.slow
def test_baton_serve_names_a_gguf_model_and_logs_where_it_came_from(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    file = FIXTURES / "tiny-q8_0.gguf"
    command = [sys.executable, "-m", "baton.app.cli", "serve", "--model", str(file)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--device", "cpu", "--port", str(port), "--num-kv-blocks", "64"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "BATON_CACHE": str(tmp_path / "cache")},
        )
    try:
        wait_until_healthy(process, port, log)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny-q8_0"]
        messages = [{"role": "user", "content": "hi"}]
        body = {"model": "tiny-q8_0", "messages": messages, "max_tokens": 3}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    folder = tmp_path / "cache" / "gguf"
    assert re.search(
        rf"loaded the GGUF file {re.escape(str(file))} \(llama, Q8_0; converted into "
        rf"{re.escape(str(folder))}/tiny-q8_0-[0-9a-f]{{16}}\) \(LlamaForCausalLM on the native "
        r"path\)",
        text,
    ), text
