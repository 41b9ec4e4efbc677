"""Linear layers over weights packed once: through oneDNN (baton.kernels.linear, bfloat16's path and
float32's where the C++ kernels did not build), F.linear's results up to float rounding and a
row's bits independent of its batch; and the model's packing, where float32 takes Baton's own
kernel (tests/test_f32_linear_cpu.py tests the kernel itself)."""

from __future__ import annotations

import pytest
import torch

from baton.core.checkpoint.model_config import ModelConfig
from baton.gpu.loader import load_model
from baton.gpu.models.model import Linear
from baton.kernels.f32_linear import f32_kernel_available
from baton.kernels.linear import (
    cpu_has_native_bf16,
    onednn_linear,
    onednn_linear_available,
    pack_linear_weight,
)


def test_the_pinned_cpu_torch_has_the_onednn_operators() -> None:
    # Without them the CPU executor silently keeps F.linear (slower, not batch-invariant).
    assert onednn_linear_available()


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear(rows: int, with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=generator)
    bias = torch.randn(96, generator=generator) if with_bias else None
    x = torch.randn(rows, 80, generator=generator)

    out = onednn_linear(x, pack_linear_weight(weight, rows_hint=64), bias)

    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, bias))


def test_a_rows_result_does_not_depend_on_the_rows_beside_it() -> None:
    generator = torch.Generator().manual_seed(0)
    packed = pack_linear_weight(torch.randn(704, 128, generator=generator), rows_hint=64)
    x = torch.randn(257, 128, generator=generator)
    alone = torch.cat([onednn_linear(x[i : i + 1], packed, None) for i in range(len(x))])

    for rows in (2, 15, 64, 65, 257):
        assert torch.equal(onednn_linear(x[:rows], packed, None), alone[:rows]), rows


def test_packing_a_layer_drops_its_float_weight_and_keeps_its_shape() -> None:
    layer = Linear(32, 48, bias=True)
    x = torch.randn(5, 32)
    expected = layer(x).detach()

    layer.pack(rows_hint=8)

    assert layer.weight.is_meta and layer.weight.shape == (48, 32)
    torch.testing.assert_close(layer(x), expected)


def test_model_packs_every_linear_and_a_tied_lm_head(make_checkpoint) -> None:
    if not f32_kernel_available():
        pytest.skip("this build's float32 linears run in oneDNN: the kernel has no vector code")
    config = ModelConfig.from_pretrained(make_checkpoint("llama", tie_word_embeddings=True))
    model = load_model(config, "cpu", torch.float32)
    num_params = sum(p.numel() for p in model.parameters())
    hidden = torch.randn(3, config.hidden_size)
    expected = model.compute_logits(hidden)

    assert model.pack_linear_weights(rows_hint=4)

    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed_weight is not None for m in linears)
    # float32: Baton's kernel's layout, [ceil(out / 16), in, 16], not oneDNN's opaque tensor.
    assert not any(m.packed_weight.is_mkldnn for m in linears)
    assert linears[0].packed_weight.shape[-1] == 16
    # The embedding table stays for lookups; the LM head reads its own packed copy.
    assert not model.embed_tokens.weight.is_meta
    assert sum(p.numel() for p in model.parameters()) == num_params
    torch.testing.assert_close(model.compute_logits(hidden), expected)


def test_bfloat16_models_are_not_packed_where_the_cpu_emulates_it(
    make_checkpoint, monkeypatch
) -> None:
    monkeypatch.setattr("baton.gpu.models.model.cpu_has_native_bf16", lambda: False)
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    model = load_model(config, "cpu", torch.bfloat16)

    assert not model.pack_linear_weights(rows_hint=4)
    assert all(m.packed_weight is None for m in model.modules() if isinstance(m, Linear))


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no AVX512_BF16 or AMX")
def test_bfloat16_models_are_packed_where_the_cpu_has_it(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    model = load_model(config, "cpu", torch.bfloat16)
    hidden = torch.randn(3, config.hidden_size, dtype=torch.bfloat16)
    expected = model.layers[0].mlp(hidden)

    assert model.pack_linear_weights(rows_hint=4)

    torch.testing.assert_close(model.layers[0].mlp(hidden), expected, rtol=2e-2, atol=2e-2)
