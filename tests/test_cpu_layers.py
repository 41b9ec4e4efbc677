"""A step's decoder layers in one C++ call (gpu/models/cpu_layers.py): the same logprobs, bit for
bit,
as the layers run from Python, for float32 and int8 weights, alone and batched, prefills and
decodes; and the models it leaves to Python."""

from __future__ import annotations

import random

import pytest
import torch

from baton.app.llm import LLM
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.loader import load_model
from baton.gpu.models.cpu_layers import CpuLayers
from baton.gpu.models.quantization import quantize_decoder_layers
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.f32_linear import f32_kernel_available


@pytest.fixture(autouse=True)
def kernels_built():
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()


def run(llm: LLM, fused: bool, prompts: list[list[int]]) -> list:
    executor = llm.engine.executor
    saved = executor.cpu_layers
    if not fused:
        executor.cpu_layers = None
    try:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3)
        outputs = llm.generate(prompts, params)
    finally:
        executor.cpu_layers = saved
    return [[(t.token_id, t.logprob, t.top) for t in out.logprobs] for out in outputs]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_one_call_gives_the_python_layers_logprobs_bit_for_bit(
    make_checkpoint, family, quantization
):
    # qwen2 has biases on its qkv projection. Without prefix caching each run prefills alike.
    llm = LLM(
        make_checkpoint(family),
        device="cpu",
        quantization=quantization,
        enable_prefix_caching=False,
    )
    executor = llm.engine.executor
    assert executor.cpu_layers is not None
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (5, 17, 40)]

    before, steps_before = executor.num_cpu_layer_steps, executor.num_steps
    fused = run(llm, True, prompts)
    # Every step: the three prompts' prefill, then 11 decodes.
    assert executor.num_cpu_layer_steps - before == executor.num_steps - steps_before == 12
    python = run(llm, False, prompts)

    assert fused == python
    # One at a time as well: each prompt and decode then runs alone in the call.
    assert run(llm, True, prompts[1:2]) == python[1:2]


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("qwen3", {}),  # q/k norms
        ("gemma3", {}),  # Gemma's extra norms, windows
        ("mixtral", {}),  # mixture of experts
        ("mistral", {"sliding_window": 8}),
    ],
)
def test_layers_it_does_not_take_stay_in_python(make_checkpoint, family, overrides):
    config = ModelConfig.from_pretrained(make_checkpoint(family, **overrides))
    model = load_model(config, "cpu", torch.float32)
    model.pack_linear_weights(rows_hint=4)

    assert CpuLayers.of(model) is None


def test_unpacked_float_weights_stay_in_python(make_checkpoint):
    # Only oneDNN-packed or int8-packed linears go to C++; F.linear stays where it is.
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    model = load_model(config, "cpu", torch.float32)
    assert CpuLayers.of(model) is None

    quantize_decoder_layers(model)  # int8 linears, packed for the kernel
    assert CpuLayers.of(model) is not None


def test_a_float32_gate_up_packed_without_its_gate_stays_in_python(make_checkpoint):
    if not f32_kernel_available():
        pytest.skip("this build's float32 linears run in oneDNN: the kernel has no vector code")
    # The C++ op reads a float32 gate_up of Baton's kernel in the gated layout: one packed as
    # a plain linear (its rows in [gate | up] order) is not handed to it.
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    model = load_model(config, "cpu", torch.float32)
    for layer in model.layers:
        layer.mlp.gate_up_proj.pack(rows_hint=4)  # plain, not MLP.pack's gated layout
    model.pack_linear_weights(rows_hint=4)

    assert not any(layer.mlp.gated_in_kernel for layer in model.layers)
    assert CpuLayers.of(model) is None
