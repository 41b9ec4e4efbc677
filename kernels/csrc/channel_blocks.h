// The parallel schedule Baton's CPU linear kernels share: output-channel groups split over
// torch's threads, each thread walking its share a block of groups at a time (a block's
// weights stay in L2) and passing every row tile over the block before the next.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace baton {

// `row_tile(first_row, rows, group_begin, group_end)` for every tile of up to `max_tile` of
// the `num_rows` rows and every block of up to `block` of the `groups` channel groups.
template <typename RowTile>
void over_channel_blocks(int64_t groups, int64_t grain, int64_t block, int64_t num_rows,
                         int64_t max_tile, const RowTile& row_tile) {
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; g += block) {
      const int64_t g_end = std::min(end, g + block);
      for (int64_t m = 0; m < num_rows; m += max_tile) {
        row_tile(m, static_cast<int>(std::min<int64_t>(max_tile, num_rows - m)), g, g_end);
      }
    }
  });
}

}  // namespace baton
