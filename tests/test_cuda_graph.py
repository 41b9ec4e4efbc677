"""CUDA-graph decode steps on the CPU: bucket choice, and the padded forward run eagerly in
place of a replay, which must give what the unpadded path gives (through the torch references,
and through the Triton kernels in the interpreter, `TRITON_INTERPRET=1` set before any kernel
module is imported)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from baton.app.cli import build_parser, engine_config_from
from baton.app.llm import LLM
from baton.core.batch import Batch, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.cuda_graph import DecodeGraphs, graph_batch_sizes, padded_batch_size
from baton.gpu.executor import TorchExecutor
from baton.kernels import ops


def test_batch_sizes_step_finely_to_32_then_by_16_up_to_max_num_seqs() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert graph_batch_sizes(50) == [1, 2, 4, 8, 16, 24, 32, 48, 50]
    assert graph_batch_sizes(256)[6:] == [32, *range(48, 257, 16)]


def test_a_batch_pads_to_the_smallest_size_that_holds_it() -> None:
    sizes = graph_batch_sizes(50)

    chosen = {n: padded_batch_size(n, sizes) for n in (1, 3, 4, 5, 17, 25, 33, 48, 49, 50, 51)}

    assert chosen == {
        1: 1,
        3: 4,
        4: 4,
        5: 8,
        17: 24,
        25: 32,
        33: 48,
        48: 48,
        49: 50,
        50: 50,
        51: None,
    }


def step(request_id: str, token_ids: list[int], start: int, table: list[int]) -> ScheduledSequence:
    return ScheduledSequence(
        request_id=request_id,
        token_ids=token_ids,
        start_position=start,
        block_table=table,
        sample=True,
        sampling_params=SamplingParams(temperature=0.0),
        all_token_ids=[1] * start + token_ids,
        num_prompt_tokens=start + len(token_ids),
    )


@pytest.fixture(scope="module")
def executor(make_checkpoint) -> TorchExecutor:
    config = ModelConfig.from_pretrained(make_checkpoint("qwen3"))
    engine = EngineConfig(max_model_len=64, max_num_seqs=6, block_size=4, num_kv_blocks=40)
    return TorchExecutor(config, engine, device="cpu")


def test_the_cpu_executor_runs_every_step_eagerly(executor: TorchExecutor) -> None:
    assert not executor.engine_config.enforce_eager
    assert executor.graphs is None


def test_only_decode_only_batches_within_the_largest_size_take_the_graph_path(
    executor: TorchExecutor,
) -> None:
    graphs = DecodeGraphs(executor.model, executor.kv_caches, executor.buffers, [1, 2, 4])
    decode = step("d", [5], 7, [1, 2])

    assert graphs.padded_size(Batch([decode] * 3)) == 4
    assert graphs.padded_size(Batch([decode] * 5)) is None
    assert graphs.padded_size(Batch([decode, step("p", [5, 6], 0, [3])])) is None
    assert graphs.padded_size(Batch()) is None


def decode_after_prefill(executor: TorchExecutor) -> Batch:
    """Prefill three prompts through `executor`, then the batch of their next decodes."""
    tables = {"a": [3, 9, 4], "b": [7], "c": [11, 12]}
    prompts = {"a": list(range(20, 29)), "b": [5, 6, 7], "c": [40, 41, 42, 43, 44]}
    history = Batch([step(r, p, 0, tables[r]) for r, p in prompts.items()], num_prefill_tokens=17)
    executor.execute(history)
    return Batch([step(r, [60], len(p), tables[r]) for r, p in prompts.items()])


@torch.inference_mode()
def assert_padded_decode_matches_unpadded(executor: TorchExecutor, decodes: Batch) -> None:
    """The padded forward gives the real rows the unpadded hidden states and K/V, and its
    padding rows write nothing (they read slot 0 of block 0, which no sequence here owns)."""
    model, kv_caches, buffers = executor.model, executor.kv_caches, executor.buffers
    graphs = DecodeGraphs(model, kv_caches, buffers, [1, 2, 4, 6])
    unpadded = buffers.prepare(decodes)
    expected = model(unpadded.input_ids, unpadded.positions, unpadded.attn_metadata, kv_caches)
    expected_kv = [cache.clone() for cache in kv_caches]
    for cache in kv_caches:
        cache[:, 0].fill_(0.25)

    actual = graphs.run(buffers.prepare(decodes, pad_to=4))

    assert actual.shape[0] == 4
    torch.testing.assert_close(actual[:3], expected, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(actual).all()
    for cache, unpadded_cache in zip(kv_caches, expected_kv, strict=True):
        assert (cache[:, 0] == 0.25).all()
        torch.testing.assert_close(cache[:, 1:], unpadded_cache[:, 1:], rtol=1e-5, atol=1e-5)
        cache[:, 0].zero_()


def test_padded_decode_through_the_references_matches_the_unpadded_one(
    executor: TorchExecutor,
) -> None:
    assert_padded_decode_matches_unpadded(executor, decode_after_prefill(executor))


def test_padded_decode_through_the_triton_kernels_matches_the_unpadded_one(
    executor: TorchExecutor,
) -> None:
    with ops.force_triton():
        assert_padded_decode_matches_unpadded(executor, decode_after_prefill(executor))


def test_capture_warms_up_then_captures_each_size_largest_first_into_one_pool(
    executor: TorchExecutor, monkeypatch
) -> None:
    events: list[tuple] = []
    pool = object()

    class RecordedGraph:
        """Stands in for torch.cuda.CUDAGraph on the CPU."""

        def __init__(self) -> None:
            events.append(("new", self))

        def replay(self) -> None:
            events.append(("replay", self))

    class Capture:
        def __init__(self, graph: RecordedGraph, pool: object) -> None:
            self.graph, self.pool = graph, pool

        def __enter__(self) -> None:
            events.append(("capture", self.graph, self.pool))

        def __exit__(self, *exc) -> None:
            events.append(("end", self.graph))

    def model(input_ids, positions, attn_metadata, kv_caches) -> torch.Tensor:
        # All padding rows: token 0 at position 0, nothing written to the cache.
        assert not input_ids.any() and not positions.any()
        assert (attn_metadata.slot_mapping == -1).all()
        events.append(("forward", len(input_ids)))
        return torch.full((len(input_ids), 8), float(len(events)))

    monkeypatch.setattr(torch.cuda, "CUDAGraph", RecordedGraph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: pool)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    graphs = DecodeGraphs(model, executor.kv_caches, executor.buffers, [1, 2, 4])

    graphs.capture()

    new = [event[1] for event in events if event[0] == "new"]
    assert graphs.captured_sizes == [1, 2, 4]
    assert events == [
        event
        for size, graph in zip((4, 2, 1), new, strict=True)
        for event in (
            ("forward", size),
            ("new", graph),
            ("capture", graph, pool),
            ("forward", size),
            ("end", graph),
        )
    ]

    decode = step("d", [5], 7, [1, 2])
    num_captured = len(events)
    hidden = graphs.run(executor.buffers.prepare(Batch([decode] * 3), pad_to=4))

    assert events[num_captured:] == [("replay", new[0])]
    # The output captured for size 4: the forward inside its capture was the 4th event.
    assert hidden.shape == (4, 8) and (hidden == 4.0).all()


def test_generation_through_padded_decode_steps_matches_the_eager_path(make_checkpoint) -> None:
    llm = LLM(
        make_checkpoint("llama"),
        device="cpu",
        max_model_len=96,
        max_num_seqs=6,
        max_num_batched_tokens=24,
        block_size=4,
        num_kv_blocks=160,
        enable_prefix_caching=False,
    )
    prompts = [[7 + i, *range(30 + 3 * i, 40 + 7 * i)] for i in range(5)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6 + 2 * i, ignore_eos=True) for i in range(4)
    ]
    params.append(SamplingParams(temperature=0.9, seed=3, max_tokens=9, ignore_eos=True))
    executor = llm.engine.executor
    eager = [r.token_ids for r in llm.generate(prompts, params)]
    assert executor.num_graph_steps == 0

    executor.graphs = DecodeGraphs(
        executor.model, executor.kv_caches, executor.buffers, graph_batch_sizes(6)
    )
    padded = [r.token_ids for r in llm.generate(prompts, params)]

    assert padded == eager
    assert executor.num_graph_steps > 0
    assert executor.host_time_s < executor.step_time_s
    assert executor.num_steps > executor.num_graph_steps


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_enforce_eager_flag_reaches_the_engine_config(command: str) -> None:
    extra = ["--prompt", "hi"] if command == "generate" else []

    default = engine_config_from(build_parser().parse_args([command, *extra]))
    eager = engine_config_from(build_parser().parse_args([command, "--enforce-eager", *extra]))

    assert (default.enforce_eager, eager.enforce_eager) == (False, True)
