"""Every causal LM type the installed transformers knows is either served exactly (greedy output
equal to transformers' own alone, 8 at once, and a 200-token prompt in 16-token chunks with a
warm prefix cache) or refused at load with its true reason; the verdicts are pinned in
tests/causal_lm_sweep_expected.py, so a type whose verdict changes fails here."""

from __future__ import annotations

import json

import pytest

from baton.core.checkpoint.model_impl import generic_model_config
from baton.core.checkpoint.unsupported_model import RefusalReason, UnsupportedModelError
from baton.tools.causal_lm_sweep import causal_lm_types, one_torch_thread, sweep_verdict
from baton.tools.tiny_causal_lm import write_tiny_checkpoint
from tests.causal_lm_sweep_expected import EXPECTED
from tests.server_harness import model_engine


@pytest.fixture(scope="module", autouse=True)
def tiny_models_on_one_thread():
    with one_torch_thread():
        yield


def test_the_expected_table_names_every_causal_lm_type_of_transformers():
    assert sorted(EXPECTED) == causal_lm_types()


@pytest.mark.parametrize("model_type", sorted(EXPECTED))
def test_causal_lm_type_is_exact_or_refused_for_its_reason(model_type, hf_tokenizer, tmp_path):
    verdict = sweep_verdict(model_type, hf_tokenizer, workdir=tmp_path)
    assert verdict.label == EXPECTED[model_type], str(verdict)


def test_no_type_is_wrong_or_crashed_in_the_expected_table():
    assert all(v == "exact" or v.startswith(("refused: ", "unbuilt")) for v in EXPECTED.values())
    reasons = {v.removeprefix("refused: ") for v in EXPECTED.values() if v.startswith("refused")}
    assert reasons <= {reason.value for reason in RefusalReason}


def test_a_model_with_convolution_layers_is_refused_for_its_recurrent_state(hf_tokenizer, tmp_path):
    write_tiny_checkpoint("lfm2", tmp_path, hf_tokenizer)  # one short-convolution layer
    with pytest.raises(UnsupportedModelError, match="recurrent or convolution state") as error:
        model_engine(tmp_path, num_kv_blocks=16)
    assert error.value.reason is RefusalReason.RECURRENT_STATE


def test_an_encoder_without_is_decoder_is_refused_as_not_causal(hf_tokenizer, tmp_path):
    import transformers

    config = transformers.BertConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    config.intermediate_size = 128
    transformers.BertLMHeadModel(config).save_pretrained(tmp_path)
    hf_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="is_decoder") as error:
        model_engine(tmp_path, num_kv_blocks=16)
    assert error.value.reason is RefusalReason.NOT_CAUSAL


@pytest.mark.parametrize(
    ("config_class", "sizes", "expected"),
    [
        ("MptConfig", dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=256), (64, 4, 2, 256)),
        (
            "DbrxConfig",
            dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=256)
            | dict(attn_config=dict(kv_n_heads=2)),
            (64, 4, 2, 256),
        ),
        (
            "XGLMConfig",
            dict(d_model=64, attention_heads=4, num_layers=2, max_position_embeddings=256),
            (64, 4, 2, 256),
        ),
    ],
    ids=["mpt", "dbrx", "xglm"],
)
def test_the_generic_config_reads_each_familys_own_size_names(
    tmp_path, config_class, sizes, expected
):
    import transformers

    config = getattr(transformers, config_class)(vocab_size=512, **sizes)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    read = generic_model_config(tmp_path)
    assert (
        read.hidden_size,
        read.num_attention_heads,
        read.num_hidden_layers,
        read.max_position_embeddings,
    ) == expected


def test_keys_and_values_of_different_sizes_per_head_are_served_exactly(hf_tokenizer, tmp_path):
    from baton.app.llm import LLM
    from baton.core.sampling_params import SamplingParams
    from baton.tools.causal_lm_sweep import scenario_prompts, transformers_greedy

    # Multi-head latent attention: keys of 16 + 8 rotary channels per head, values of 16.
    reference = write_tiny_checkpoint("deepseek_v3", tmp_path, hf_tokenizer)
    llm = LLM(tmp_path, device="cpu", max_model_len=256, num_kv_blocks=32, block_size=16)
    assert llm.engine.executor.model_config.head_dim == 24  # values padded to the key size
    prompts = scenario_prompts()["8 at once"][:4]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == transformers_greedy(reference, prompt, 6)


def test_layers_with_different_numbers_of_kv_heads_are_refused():
    from baton.gpu.models.generic_refusals import check_probe

    flags = dict(softcapped=False, causal=True, masked=False)
    check_probe("SameHeads", [(2, 16, 16), (2, 32, 32), (2, 24, 16)], **flags)  # sizes pad
    with pytest.raises(UnsupportedModelError, match=r"\[2, 4\] KV heads") as error:
        check_probe("MixedHeads", [(2, 16, 16), (4, 16, 16)], **flags)
    assert error.value.reason is RefusalReason.KV_SHAPES_DIFFER
