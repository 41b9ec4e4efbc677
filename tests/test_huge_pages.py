"""The packed weights' move onto transparent huge pages (gpu/huge_pages.py): values and holders
intact, shared data kept shared, nothing moved where the system has no huge pages, and an engine's
outputs bit for bit those of one whose weights stayed where they were."""

from __future__ import annotations

import pytest
import torch

import baton.gpu.prepared_model
from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from baton.gpu import huge_pages
from baton.gpu.huge_pages import HUGE_PAGE, huge_page_bytes, move_to_huge_pages, thp_mode
from baton.gpu.models.cpu_layers import streamed_weights

THP = thp_mode() in ("always", "madvise")


def test_moved_tensors_keep_their_values_and_every_holder_sees_the_move() -> None:
    torch.manual_seed(0)
    big = torch.randn(4 * HUGE_PAGE // 4)  # 8 MiB of float32
    codes = torch.randint(-127, 128, (1000, 77), dtype=torch.int8)
    alias = big.view(big.shape)  # another tensor object over the same data
    values = [big.clone(), codes.clone()]
    holders = {"layer": [big, codes]}
    before = huge_page_bytes()

    moved = move_to_huge_pages([big, codes, alias])

    if not THP:
        assert moved == 0
        return
    assert moved >= big.nbytes + codes.nbytes
    assert torch.equal(holders["layer"][0], values[0])
    assert torch.equal(holders["layer"][1], values[1])
    assert big.data_ptr() % HUGE_PAGE == 0  # the first tensor starts on a huge page
    assert alias.data_ptr() == big.data_ptr()  # shared data stays shared
    big.add_(1.0)
    assert torch.equal(alias, values[0] + 1.0)
    if before is not None:
        # At least one of the four huge pages under `big` (the kernel may be short of them).
        assert huge_page_bytes() >= before + HUGE_PAGE


def test_nothing_moves_where_transparent_huge_pages_are_off(tmp_path, monkeypatch) -> None:
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "THP_SETTING", setting)
    tensor = torch.ones(1000)
    address = tensor.data_ptr()
    assert thp_mode() == "never"
    assert move_to_huge_pages([tensor]) == 0
    assert tensor.data_ptr() == address


def test_tensors_it_cannot_move_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        move_to_huge_pages([torch.ones(8, 8).t()])
    shared = torch.ones(64)
    with pytest.raises(ValueError, match="one shape"):
        move_to_huge_pages([shared, shared.view(8, 8)])


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_an_engine_on_huge_pages_gives_the_same_logprobs(
    make_checkpoint, monkeypatch, quantization
) -> None:
    checkpoint = make_checkpoint("llama")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3)
    prompts = [[5, 9, 200, 31, 7], list(range(3, 60))]

    def run() -> tuple[list, list[torch.Tensor]]:
        llm = LLM(checkpoint, device="cpu", quantization=quantization)
        outputs = llm.generate(prompts, params)
        logprobs = [[(t.token_id, t.logprob, t.top) for t in out.logprobs] for out in outputs]
        return logprobs, streamed_weights(llm.engine.executor.model)

    moved, weights = run()
    assert weights  # every linear and the LM head packed for Baton's kernels
    if THP:
        # Side by side in one mapping, from its first huge-page boundary.
        addresses = sorted(w.data_ptr() for w in weights)
        assert addresses[0] % HUGE_PAGE == 0
        assert addresses[-1] - addresses[0] < sum(w.nbytes for w in weights) + HUGE_PAGE
    monkeypatch.setattr(baton.gpu.prepared_model, "move_to_huge_pages", lambda tensors: 0)
    stayed, _ = run()
    assert moved == stayed
