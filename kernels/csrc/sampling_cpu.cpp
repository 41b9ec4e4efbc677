// Greedy sampling on the CPU: each row's argmax over float32 logits, as torch.argmax(dim=-1)
// answers it (the first index of the largest value; the first NaN's where a row has one).
//
// torch's CPU argmax compares one element at a time, carrying its index, which over a
// vocabulary's width is a visible share of a small model's decode step. Here a row is read in
// blocks: the maximum of each block (a vectorized reduction), then the first block whose
// maximum is the row's, then the first element of that block equal to it, rows split over the
// threads. Equal values keep the lowest index (-0.0 equals 0.0, as in torch's comparisons).

#include <ATen/ATen.h>
#include <torch/library.h>

#include "parallel_shares.h"
#include "tuning.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// Elements a block: a few vectors, so the block maxima stay few and the last scan short.
constexpr int64_t kBlock = baton::tuning::kArgmaxBlock;
// Rows a parallel task: a decode step's few rows stay on one thread.
constexpr int64_t kRowGrain = baton::tuning::kArgmaxRowGrain;

// The largest of `len` values and how many of them are NaN (unordered with themselves).
inline float block_max(const float* x, int64_t len, int& num_nan) {
  float m = -std::numeric_limits<float>::infinity();
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(+ : nan)
  for (int64_t i = 0; i < len; ++i) {
    m = x[i] > m ? x[i] : m;
    nan += x[i] != x[i];
  }
  num_nan += nan;
  return m;
}

int64_t argmax_row(const float* x, int64_t n, std::vector<float>& maxima) {
  const int64_t num_full = n / kBlock, num_blocks = (n + kBlock - 1) / kBlock;
  maxima.resize(num_blocks);
  int num_nan = 0;
  // Full blocks have a fixed trip count, which the compiler unrolls into whole vectors.
  for (int64_t b = 0; b < num_full; ++b) maxima[b] = block_max(x + b * kBlock, kBlock, num_nan);
  if (num_full < num_blocks) {
    maxima[num_full] = block_max(x + num_full * kBlock, n - num_full * kBlock, num_nan);
  }
  if (num_nan > 0) {
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] != x[i]) return i;
    }
  }
  float best = maxima[0];
  for (int64_t b = 1; b < num_blocks; ++b) best = maxima[b] > best ? maxima[b] : best;
  for (int64_t b = 0; b < num_blocks; ++b) {
    if (maxima[b] != best) continue;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) {
      if (x[i] == best) return i;
    }
  }
  return 0;  // not reached: some element equals the maximum
}

// int64 [rows]: the argmax of each row of `logits` [rows, vocab].
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat,
              "logits are float32 on the CPU");
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1 && logits.size(1) > 0,
              "logits are [rows, vocab], contiguous rows, vocab > 0");
  const int64_t rows = logits.size(0), n = logits.size(1), ld = logits.stride(0);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* xp = logits.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  baton::parallel_rows(rows, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> maxima;
    for (int64_t r = begin; r < end; ++r) op[r] = argmax_row(xp + r * ld, n, maxima);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(baton_cpu, m) { m.def("argmax_rows(Tensor logits) -> Tensor"); }

TORCH_LIBRARY_IMPL(baton_cpu, CPU, m) { m.impl("argmax_rows", &argmax_rows); }
