// The CPU kernels' tuned constants, in one table, so that the next person can re-tune them on
// another CPU. Each line's tag names where its value was chosen:
//   [EPYC]         a 2-vCPU AMD EPYC VM, family 25 model 1 (Zen 3): AVX2, FMA and F16C, no
//                  AVX-512; 512 KiB of L2 a core.
//   [Xeon]         a 2-core Intel Xeon VM, family 6 model 167: AVX-512 F/BW/VL/VNNI/BF16,
//                  AVX-VNNI and AMX; 48 KiB of L1d and 2 MiB of L2 a core. Its own build
//                  (-march=native) and its AVX2 code paths, built there for an AVX2-only CPU
//                  (BATON_CPU_MARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2).
//   [Xeon AVX2], [Xeon native]   one of those two builds alone.
//   [set]          chosen from the hardware's sizes and costs, not measured against other values.
// The measurements are in docs/benchmarks.md. No value here changes a result's bits: the tests
// hold every row to the same bits whatever the tiles, chunks and thread split.
//
// To re-tune a linear kernel's value, change it and time it against the committed one, which
// --baseline builds beside it in the same process (checking too that both give the same bits):
//   PYTHONPATH=$PWD python benchmarks/linear_decode_cpu.py --model bench --rows 1 2 4 8 16 32 \
//       --baseline HEAD
// (--model 0.4b for larger shapes, --rows 41 256 2048 for prefill sizes). The tiles alone,
// cache-warm, and the attention kernel are timed from each tree in turn, alternating:
//   PYTHONPATH=$PWD python benchmarks/linear_tiles_cpu.py --rows 1 4 6 8 32
//   PYTHONPATH=$PWD python benchmarks/decode_attention_cpu.py --lengths 104 350 \
//       --prefill 40/40 512/600
// Each natively, and again with BATON_CPU_MARCH=x86-64-v3 ATEN_CPU_CAPABILITY=avx2, every build
// with a TORCH_EXTENSIONS_DIR of its own. The layer ops' and the argmax's values have no
// benchmark of their own.
#pragma once

#include <cstdint>

namespace baton::tuning {

// Both linear kernels' schedule (linear_kernels.h, parallel_shares.h).
// [EPYC] Rows up to which a linear takes the decode schedule (chunks in L1), past it prefill's.
constexpr int64_t kChunkRows = 32;
// [Xeon AVX2] Activation bytes of a prefill row block, over which every weight block passes.
constexpr int64_t kRowBlockBytes = 1 << 20;
// [EPYC, Xeon AVX2] Shares a thread of a parallel loop, for the others to take from a stalled one.
constexpr int64_t kSharesPerThread = 8;
// [set] Microseconds a pool thread spins for the next loop (or the caller for the last share)
// before it sleeps: longer than the gaps between a step's loops, shorter than those between steps.
constexpr int64_t kPoolSpinMicros = 100;

// The float32 linear (f32_linear_cpu.cpp); a step is one k of a 16-channel panel, 64 bytes.
// [set] Multiply-adds a parallel task takes at least: below them a fork costs more.
constexpr int64_t kF32TaskMacs = 1 << 16;
// [set] Weight bytes of a prefill block of panels, which stays in L2 while the tiles pass.
constexpr int64_t kF32BlockBytes = 256 * 1024;
// [EPYC] Steps of a decode chunk, over which every row tile passes while it is in L1.
constexpr int64_t kF32ChunkSteps = 32;
// [EPYC, Xeon] How far ahead a tile prefetches where one tile passes over all of K, in steps.
constexpr int64_t kF32PrefetchSteps = 128;
// [Xeon] How far ahead a chunk's first tile prefetches where several tiles share each chunk.
constexpr int64_t kF32SharedPrefetchSteps = 16;
// [Xeon] How far ahead a prefill tile prefetches its panels, in steps.
constexpr int64_t kF32PrefillPrefetchSteps = 64;
// [Xeon AVX2] Rows from which a tile unrolls its k loop by two.
constexpr int kF32UnrollRows = 3;
// [Xeon native] Rows of a prefill tile where a panel's line is one vector: it takes two panels.
constexpr int kF32PrefillPairRows = 8;
// [Xeon native] Rows from which decode tiles take two panels where a line is one vector.
constexpr int64_t kF32DecodePairRows = 4;

// The int8 linear (int8_linear_cpu.cpp); a block is 8 k steps of a 12-channel group, 96 bytes.
// [set] Multiply-adds a parallel task takes at least: below them a fork costs more.
constexpr int64_t kInt8TaskMacs = 1 << 17;
// [set] Code bytes of a prefill block of groups, which stays in L2 while the tiles pass.
constexpr int64_t kInt8BlockBytes = 128 * 1024;
// [EPYC] Blocks of a decode chunk, over which every row tile passes while it is in L1.
constexpr int64_t kInt8DecodeChunkBlocks = 32;
// [Xeon] How far ahead a tile prefetches where one tile passes over all of K, in blocks.
constexpr int64_t kInt8PrefetchBlocks = 64;
// [Xeon] How far ahead where several tiles share each chunk (and in prefill, unmeasured).
constexpr int64_t kInt8SharedPrefetchBlocks = 16;
// [Xeon native] Rows of an AVX-512 tile, 3 accumulators a row.
constexpr int kInt8Avx512MaxRows = 6;
// [set] Activations a parallel task quantizes at least.
constexpr int64_t kInt8TaskValues = 1 << 15;

// Paged attention (paged_attention_cpu.cpp).
// [EPYC] Prefill rows of one sequence a task takes together, reading each block once for all.
constexpr int64_t kAttentionTileRows = 8;
// [set] Tiles a thread from which a task takes a tile's every KV head, not one head.
constexpr int kAttentionTilesPerThread = 4;

// The layer ops (layer_ops_cpu.cpp) and greedy sampling (sampling_cpu.cpp).
// [set] Rows a parallel task of the norms, gates and rotary takes at least.
constexpr int64_t kLayerOpRowGrain = 16;
// [set] Rows a parallel task of the argmax takes at least.
constexpr int64_t kArgmaxRowGrain = 4;
// [set] Logits a block of the argmax, whose maximum is taken first: a few vectors.
constexpr int64_t kArgmaxBlock = 64;

}  // namespace baton::tuning
