// What Baton's CPU linear kernels (f32_linear_cpu.cpp, int8_linear_cpu.cpp) share: the checks of
// the activations and the bias, and the parallel schedule: output-channel groups split over
// torch's threads, each thread walking its share a block of groups at a time (a block's
// weights stay in L2) and passing every row tile over the block before the next.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace baton {

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

// `row_tile(first_row, rows, group_begin, group_end)` for every row tile and every block of up
// to `block` of the `groups` channel groups. The `num_rows` rows are cut into as few tiles of at
// most `max_tile` as they need, as even as can be: 8 rows in tiles of 6 would leave a tile of
// 2, whose few accumulators wait on the multiply-adds' latency; as 4 and 4 both tiles run at
// the units' pace.
template <typename RowTile>
void over_channel_blocks(int64_t groups, int64_t grain, int64_t block, int64_t num_rows,
                         int64_t max_tile, const RowTile& row_tile) {
  const int64_t num_tiles = (num_rows + max_tile - 1) / max_tile;
  const int64_t base = num_tiles > 0 ? num_rows / num_tiles : 0;
  const int64_t longer = num_tiles > 0 ? num_rows % num_tiles : 0;  // tiles of base + 1 rows
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; g += block) {
      const int64_t g_end = std::min(end, g + block);
      int64_t m = 0;
      for (int64_t t = 0; t < num_tiles; ++t) {
        const int64_t rows = base + (t < longer ? 1 : 0);
        row_tile(m, static_cast<int>(rows), g, g_end);
        m += rows;
      }
    }
  });
}

}  // namespace baton
