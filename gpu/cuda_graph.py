"""CUDA graphs for decode-only steps: one captured forward per padded batch size.

A decode step launches a few hundred small kernels; replaying them as one graph takes the
launch cost off the step. A batch of n one-token sequences is padded to the smallest captured
size >= n (padding rows as `baton.gpu.input_batch` writes them), its inputs land in the same device
buffers the graph was captured on, and the graph replays. Only the model body is captured: the
LM head and sampling run eagerly on the real rows' hidden states.
"""

from __future__ import annotations

import bisect

import torch

from baton.core.batch import Batch
from baton.gpu.input_batch import InputBuffers
from baton.gpu.model_inputs import ModelInputs
from baton.gpu.models.model import CausalLM, LayerKVCache

# Small batches are common and cheap to capture, so they get fine steps; past 32, every 16.
SMALL_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32)
LARGE_BATCH_STEP = 16


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The padded batch sizes to capture: 1, 2, 4, 8, 16, 24, 32, 48, ... and max_num_seqs."""
    sizes = [size for size in SMALL_BATCH_SIZES if size < max_num_seqs]
    sizes += range(SMALL_BATCH_SIZES[-1] + LARGE_BATCH_STEP, max_num_seqs, LARGE_BATCH_STEP)
    return [*sizes, max_num_seqs]


def padded_batch_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest of `sizes` (ascending) that holds `num_seqs`; None past the largest."""
    index = bisect.bisect_left(sizes, num_seqs)
    return sizes[index] if index < len(sizes) else None


def is_decode_only(batch: Batch) -> bool:
    """Every sequence computes one token: the shape a graph was captured for."""
    return bool(batch.sequences) and all(len(s.token_ids) == 1 for s in batch.sequences)


class DecodeGraphs:
    """The model's decode forward captured per padded batch size, over shared input buffers.

    Capture runs largest size first so the smaller graphs fit in the memory pool the largest one
    reserved. A size not captured (every size before `capture`, and always on the CPU) runs the
    same padded forward eagerly: what tests compare against the unpadded path.
    """

    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[LayerKVCache],
        buffers: InputBuffers,
        batch_sizes: list[int],
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.batch_sizes = sorted(batch_sizes)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}

    @property
    def captured_sizes(self) -> list[int]:
        return sorted(self._graphs)

    def padded_size(self, batch: Batch) -> int | None:
        """The size `batch` replays at, or None when it must run eagerly (not decode-only, or
        larger than the largest size)."""
        if not is_decode_only(batch):
            return None
        return padded_batch_size(len(batch), self.batch_sizes)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size on the current CUDA device (after the KV cache is allocated).

        Each size first runs once eagerly, so Triton compiles its kernels outside the capture.
        The inputs are all padding rows: they write no K/V, so capture leaves the cache as it was.
        """
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.batch_sizes):
            inputs = self.buffers.prepare(Batch(), pad_to=size)
            self._forward(inputs)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = self._forward(inputs)
            self._graphs[size] = graph
        torch.cuda.synchronize()

    def run(self, inputs: ModelInputs) -> torch.Tensor:
        """Hidden states [size, hidden] of padded `inputs` from `InputBuffers.prepare(pad_to=)`.

        Replayed, they live in the graph's output buffer: read them before the next `run`.
        """
        graph = self._graphs.get(inputs.input_ids.shape[0])
        if graph is None:
            return self._forward(inputs)
        graph.replay()
        return self._outputs[inputs.input_ids.shape[0]]

    def _forward(self, inputs: ModelInputs) -> torch.Tensor:
        return self.model(inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_caches)
