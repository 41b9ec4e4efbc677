// Weight-only int8 linear on the CPU: out[m, n] = scales[n] * sum_k x[m, k] * codes[n, k]
// (+ bias[n]), float32 activations, int8 codes with one float32 scale per output channel, in the
// packed layout kernels/int8_linear.py's `pack_codes` makes. The reference is `int8_linear_ref`.
//
// A decode step is memory bound: the weights are read once per step, so reading one byte per
// weight instead of four is the speed-up. Each int8 is widened to float in registers and
// multiplied in float32 (no activation quantization, so the result is the reference's up to
// float rounding). Every weight vector widened is used by all the rows of a row tile, so a few
// rows cost about what one does.
//
// The packed layout, [ceil(N / 12), ceil(K / 8), 12, 8]: a group of 12 output channels stores
// its 8 weights of each k block side by side, so a tile walks its group's weights as one
// sequential stream. With the codes as [N, K] rows a tile read 6 rows at once, 8 bytes of each
// per step: 6 short streams the hardware prefetcher barely started before each row ended, and
// one thread read cold weights at ~4.6 GB/s (docs/benchmarks.md). Padding channels and the K
// tail are zero codes.
//
// Batch invariance: each (row, output channel) dot product is one 8-lane float32 accumulator fed
// in k order, the K % 8 tail as one zero-padded vector, then the same horizontal sum; whatever
// the tile shape, the number of rows or the thread split, a row's bits are the same.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

// Each sum below is ordered by hand. The build's -fassociative-math would let the compiler
// reorder the plain-C++ path's sums differently in each tile shape, and a row's bits would then
// depend on the tile it ran in; so not in this file.
#if defined(__clang__)
#pragma clang fp reassociate(off)
#elif defined(__GNUC__)
#pragma GCC optimize("no-associative-math")
#endif

namespace {

constexpr int64_t kLanes = 8;
// Output channels per group: the tiles below (6, 6, 4, 3 channels) all divide it.
constexpr int64_t kGroup = 12;
// Rows per tile: 4 rows x 3 channels = 12 accumulators, which with 3 weight vectors and an
// activation vector fill AVX2's 16 registers.
constexpr int kMaxRowTile = 4;
// Multiply-adds per parallel task: below this a fork costs more than the work.
constexpr int64_t kTaskMacs = 1 << 16;
// Weight bytes one task's channel block keeps in L2 while every row tile passes over it.
constexpr int64_t kBlockBytes = 128 * 1024;

#if defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec load_x(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load_w(const int8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}
inline Vec fma(Vec a, Vec b, Vec acc) { return _mm256_fmadd_ps(a, b, acc); }
inline float hsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
// Without AVX2 the same arithmetic on 8-lane arrays, for the compiler to vectorize as it can;
// the order per (row, channel) is still fixed by the code, not by the batch.
struct Vec {
  float v[kLanes];
};
inline Vec zero() { return Vec{}; }
inline Vec load_x(const float* p) {
  Vec r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = p[i];
  return r;
}
inline Vec load_w(const int8_t* p) {
  Vec r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = static_cast<float>(p[i]);
  return r;
}
inline Vec fma(Vec a, Vec b, Vec acc) {
  // Fused always: left to the compiler, `acc + a * b` may be fused in one tile and not another.
  for (int i = 0; i < kLanes; ++i) acc.v[i] = std::fma(a.v[i], b.v[i], acc.v[i]);
  return acc;
}
inline float hsum(Vec v) {
  float a[4];
  for (int i = 0; i < 4; ++i) a[i] = v.v[i] + v.v[i + 4];
  return (a[0] + a[2]) + (a[1] + a[3]);
}
#endif

struct Problem {
  const float* x;
  int64_t ldx;
  const int8_t* codes;  // packed: [groups][k_blocks][kGroup][kLanes]
  const float* scales;
  const float* bias;  // null when there is none
  float* out;
  int64_t K, N;
  int64_t k_blocks;  // ceil(K / kLanes)
};

// Where channel n's weights for k block 0 start; block b's are b * kGroup * kLanes further on.
inline const int8_t* channel_codes(const Problem& p, int64_t n) {
  return p.codes + ((n / kGroup) * p.k_blocks * kGroup + n % kGroup) * kLanes;
}

// R rows from `m`, C channels from `n` (all in one group): every widened weight vector feeds R
// accumulators.
template <int R, int C>
void tile(const Problem& p, int64_t m, int64_t n) {
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = zero();
  const float* x = p.x + m * p.ldx;
  const int8_t* w = channel_codes(p, n);
  constexpr int64_t kStride = kGroup * kLanes;
  const int64_t body = p.K / kLanes;
  for (int64_t b = 0; b < body; ++b, w += kStride) {
    Vec wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_w(w + c * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec xv = load_x(x + r * p.ldx + b * kLanes);
      for (int c = 0; c < C; ++c) acc[r][c] = fma(xv, wv[c], acc[r][c]);
    }
  }
  if (body < p.k_blocks) {
    // The tail: the codes are zero-padded in the layout, the rows here; the same one
    // multiply-add for every row.
    const int64_t tail = p.K - body * kLanes;
    for (int r = 0; r < R; ++r) {
      float xt[kLanes] = {};
      std::memcpy(xt, x + r * p.ldx + body * kLanes, tail * sizeof(float));
      const Vec xv = load_x(xt);
      for (int c = 0; c < C; ++c) acc[r][c] = fma(xv, load_w(w + c * kLanes), acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = p.out + (m + r) * p.N + n;
    for (int c = 0; c < C; ++c) {
      // std::fma, not `a * b + c`: the compiler may fuse that in one tile and not in another.
      const float dot = hsum(acc[r][c]);
      o[c] = p.bias ? std::fma(dot, p.scales[n + c], p.bias[n + c]) : dot * p.scales[n + c];
    }
  }
}

// Channels [n_begin, n_end) for R rows: tiles of C channels, then one channel at a time.
template <int R, int C>
void row_tile(const Problem& p, int64_t m, int64_t n_begin, int64_t n_end) {
  int64_t n = n_begin;
  for (; n + C <= n_end; n += C) tile<R, C>(p, m, n);
  for (; n < n_end; ++n) tile<R, 1>(p, m, n);
}

// The widest channel tile that fits the registers beside R rows' accumulators.
void rows(const Problem& p, int64_t m, int R, int64_t n_begin, int64_t n_end) {
  switch (R) {
    case 1: return row_tile<1, 12>(p, m, n_begin, n_end);
    case 2: return row_tile<2, 6>(p, m, n_begin, n_end);
    case 3: return row_tile<3, 4>(p, m, n_begin, n_end);
    default: return row_tile<4, 3>(p, m, n_begin, n_end);
  }
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "x is float32 on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x is [rows, in], contiguous rows");
  const int64_t M = x.size(0), K = x.size(1), N = scales.numel();
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous(),
              "scales are a contiguous float32 [out]");
  const int64_t groups = (N + kGroup - 1) / kGroup, k_blocks = (K + kLanes - 1) / kLanes;
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous(),
              "codes are contiguous int8, packed by kernels.int8_linear.pack_codes");
  TORCH_CHECK(codes.dim() == 4 && codes.size(0) == groups && codes.size(1) == k_blocks &&
                  codes.size(2) == kGroup && codes.size(3) == kLanes,
              "codes are packed [ceil(out / 12), ceil(in / 8), 12, 8] with in = x's columns and "
              "out = the scales' length");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
                "bias is a contiguous float32 [out]");
  }
  auto out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  const Problem p{x.data_ptr<float>(), x.stride(0),  codes.data_ptr<int8_t>(),
                  scales.data_ptr<float>(), has_bias ? bias->data_ptr<float>() : nullptr,
                  out.data_ptr<float>(), K, N, k_blocks};
  const int64_t macs_per_group = std::max<int64_t>(1, kGroup * K * M);
  const int64_t grain = std::max<int64_t>(1, kTaskMacs / macs_per_group);
  const int64_t block = std::max<int64_t>(1, kBlockBytes / (kGroup * std::max<int64_t>(K, 1)));
  // Split over output channels: each thread reads its own weights, once per row tile.
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; g += block) {
      const int64_t n_begin = g * kGroup, n_end = std::min(N, std::min(end, g + block) * kGroup);
      for (int64_t m = 0; m < M; m += kMaxRowTile) {
        rows(p, m, static_cast<int>(std::min<int64_t>(kMaxRowTile, M - m)), n_begin, n_end);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(baton_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scales, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(baton_cpu, CPU, m) { m.impl("int8_linear", &int8_linear); }
