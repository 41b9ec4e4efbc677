// What Baton's CPU linear kernels (f32_linear_cpu.cpp, int8_linear_cpu.cpp) share: the checks of
// the activations and the bias, and the parallel schedule: output-channel groups handed to
// torch's threads a share at a time, each thread passing every row tile over its share either a
// block of groups at a time (prefill: a block's weights stay in L2) or a chunk of one group's
// weights at a time (decode: a chunk stays in L1).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "parallel_shares.h"
#include "tuning.h"

#include <algorithm>
#include <cstdint>

#if defined(__SSE__)
#include <immintrin.h>
#endif

namespace baton {

// Whether `num_rows` rows take the decode schedule (over_weight_chunks): up to
// tuning::kChunkRows rows (a decode step's). Past it (prefill) a linear runs
// over_channel_blocks: there the multiply-adds, not DRAM, are the pass, and a tile's activations
// stay in L1 across a block.
inline bool decode_sized(int64_t num_rows) { return num_rows <= tuning::kChunkRows; }

// x is the activations [rows, in]: float32 on the CPU, each row contiguous.
inline void check_linear_input(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "x is float32 on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x is [rows, in], contiguous rows");
}

// The bias's data, checked to be a contiguous float32 [out_features], or nullptr without one.
inline const float* checked_bias(const c10::optional<at::Tensor>& bias, int64_t out_features) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                  bias->numel() == out_features,
              "bias is a contiguous float32 [out]");
  return bias->data_ptr<float>();
}

// How `num_rows` rows are cut into row tiles: into as few tiles of at most `max_tile` as they
// need, as even as can be. 8 rows in tiles of 6 would leave a tile of 2, whose few accumulators
// wait on the multiply-adds' latency; as 4 and 4 both tiles run at the units' pace.
struct RowTiles {
  int64_t count, base, longer;  // `longer` tiles of base + 1 rows, then tiles of `base`

  RowTiles(int64_t num_rows, int64_t max_tile)
      : count((num_rows + max_tile - 1) / max_tile),
        base(count > 0 ? num_rows / count : 0),
        longer(count > 0 ? num_rows % count : 0) {}

  // `each(tile_index, first_row, rows)` for every tile, in row order.
  template <typename Each>
  void for_each(const Each& each) const {
    int64_t m = 0;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t rows = base + (t < longer ? 1 : 0);
      each(t, m, static_cast<int>(rows));
      m += rows;
    }
  }
};

// Prefill-sized batches: `row_tile(first_row, rows, group_begin, group_end)` for every row tile
// and every block of up to `block` of the `groups` channel groups (fewer where that leaves too
// few shares for the threads), a block of rows of `row_bytes` each at a time. A block's weights
// stay in L2 while every row tile of the row block passes over them. The weight blocks pass
// over the rows a row block (tuning::kRowBlockBytes of activations) at a time, so a row block
// stays in the caches while every weight block passes over it: with all rows at once every
// weight block would read every row of the batch again from memory.
template <typename RowTile>
void over_channel_blocks(int64_t groups, int64_t grain, int64_t block, int64_t num_rows,
                         int64_t row_bytes, int64_t max_tile, const RowTile& row_tile) {
  const int64_t share = std::min(block, share_of(groups, grain));
  const int64_t shares = (groups + share - 1) / share;
  // Whole tiles of rows, at least one.
  const int64_t fit =
      tuning::kRowBlockBytes / std::max<int64_t>(row_bytes, 1) / max_tile * max_tile;
  const int64_t row_block = std::min(num_rows, std::max(max_tile, fit));
  const int64_t row_blocks = (num_rows + row_block - 1) / row_block;
  // A unit is one row block over one share of the groups, the units of a row block in turn:
  // each thread's run of units is whole row blocks but at its ends, so each thread keeps a row
  // block of its own in its own L2, where threads taking shares of the same row block in turn
  // would both read every row block.
  const int64_t units = row_blocks * shares;
  const int64_t unit_grain = (grain + share - 1) / share;
  parallel_shares(units, unit_grain, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t m0 = u / shares * row_block, g = u % shares * share;
      const RowTiles tiles(std::min(row_block, num_rows - m0), max_tile);
      tiles.for_each([&](int64_t, int64_t m, int rows) {
        row_tile(m0 + m, rows, g, std::min(groups, g + share));
      });
    }
  });
}

// Decode-sized batches of a few row tiles: `chunk_tile(carry, first_row, rows, group_begin,
// group_end, k_begin, k_end, turn)` for every `panels` adjacent groups of a share (the last of a
// share may hold fewer), every chunk of `chunk` of the `k_len` steps of their weights, and every
// row tile, the tiles in turn over one chunk while it is in L1. So the weights stream from DRAM
// once, at the pace of every row's multiply-adds, where block by block they would stream at the
// pace of one tile's and the other tiles then run with DRAM idle. `turn` is a tile's place among
// the chunk's tiles: 0 for the first, the one that meets the weights first (it prefetches ahead
// of the stream); `carry` is one `Carry` per share, where a tile keeps its accumulators between
// the chunks.
template <typename Carry, typename ChunkTile>
void over_weight_chunks(int64_t groups, int64_t grain, int64_t k_len, int64_t chunk,
                        int64_t num_rows, int64_t max_tile, int64_t panels,
                        const ChunkTile& chunk_tile) {
  const RowTiles tiles(num_rows, max_tile);
  // Shares of whole runs of `panels` groups, so that only the last group may be alone.
  const int64_t share = (share_of(groups, grain) + panels - 1) / panels * panels;
  parallel_shares(groups, grain, share, [&](int64_t begin, int64_t end) {
    Carry carry;
    for (int64_t g = begin; g < end; g += panels) {
      const int64_t g_end = std::min(end, g + panels);
      // At least one chunk, empty when k_len is 0: the tile that reaches the end writes the
      // outputs (the bias alone, then).
      int64_t k = 0;
      do {
        const int64_t k_end = std::min(k_len, k + chunk);
        tiles.for_each([&](int64_t t, int64_t m, int rows) {
          chunk_tile(carry, m, rows, g, g_end, k, k_end, static_cast<int>(t));
        });
        k = k_end;
      } while (k < k_len);
    }
#if defined(__SSE__)
    // The tiles may have written their outputs with non-temporal stores, which only a fence
    // orders before the parallel region's end, where other threads read them.
    _mm_sfence();
#endif
  });
}

// A linear's schedule by its row count: up to tuning::kChunkRows rows over_weight_chunks in row
// tiles of up to `max_tile` rows, `decode_panels` groups at a time, in chunks of `chunk` steps
// (or of all `k_len` where one row tile is all there is: its single pass is already the only
// one); past it over_channel_blocks in row tiles of up to `prefill_max_tile` rows, blocks of up
// to `block` groups and row blocks of rows `row_bytes` long.
template <typename Carry, typename ChunkTile, typename RowTile>
void over_rows(int64_t groups, int64_t grain, int64_t k_len, int64_t chunk, int64_t block,
               int64_t num_rows, int64_t row_bytes, int64_t max_tile, int64_t prefill_max_tile,
               int64_t decode_panels, const ChunkTile& chunk_tile, const RowTile& row_tile) {
  if (decode_sized(num_rows)) {
    const int64_t steps = num_rows <= max_tile ? std::max<int64_t>(k_len, 1) : chunk;
    over_weight_chunks<Carry>(groups, grain, k_len, steps, num_rows, max_tile, decode_panels,
                              chunk_tile);
  } else {
    over_channel_blocks(groups, grain, block, num_rows, row_bytes, prefill_max_tile, row_tile);
  }
}

}  // namespace baton
