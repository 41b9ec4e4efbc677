// Weight-only int8 linear on the CPU: out[m, n] = scales[n] * sum_k x[m, k] * codes[n, k]
// (+ bias[n]), float32 activations, int8 codes with one float32 scale per output channel, in the
// packed layout kernels/int8_linear.py's `pack_codes` makes. The reference is `int8_linear_ref`.
//
// A decode step is memory bound only if the kernel keeps up with memory: widening each weight to
// float and multiplying in float32 costs 3 vector instructions per 8 weights, and at one row that
// was slower than DRAM. So each activation row is quantized once per call to int16 (symmetric,
// one scale per row) and the dot products are integer: `vpmaddwd` of 16 weights widened to int16
// against 16 activations, 3 instructions per 16 weights, into exact int32 sums (2 where the CPU
// has VNNI, whose `vpdpwssd` multiplies and adds in one). The result
// differs from the reference by the activations' rounding only: at most half an int16 step of
// the row, |x|max / 65534, per activation, so |out - ref| <= |x|max / 65534 * sum_k |w[n, k]|
// plus float rounding (tests/test_int8_linear_cpu.py holds the kernel to that bound).
//
// The packed layout, [ceil(N / 12), ceil(K / 8), 12, 8]: a group of 12 output channels stores
// its 8 weights of each k block side by side, so a tile walks its group's weights as one
// sequential stream. 16 bytes from an even channel of a block are that channel's 8 weights and
// its neighbour's: widened, they meet the block's 8 activations stored twice, and one `vpmaddwd`
// gives 4 pair sums of each channel. Padding channels and the K tail are zero codes, and the
// quantized rows are zero-padded too, so every tile runs whole blocks of whole channel pairs.
//
// Batch invariance: a row's quantization depends on the row alone, integer sums are exact in any
// order, and the float steps (each chunk's int32 lanes added to float lanes in k order, then the
// same 4-lane sum per channel and the same scaling) are fixed by the code; whatever the tile
// shape, the number of rows or the thread split, a row's bits are the same.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "linear_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// Each float sum below is ordered by hand.
#include "ordered_sums.h"

namespace {

constexpr int64_t kLanes = 8;
// Output channels per group; a tile takes 6, 3 or 2 of its 6 channel pairs.
constexpr int64_t kGroup = 12;
constexpr int kPairs = kGroup / 2;
// A quantized activation block: 8 int16, stored twice to meet a channel pair's 16 weights.
constexpr int64_t kBlockInts = 2 * kLanes;
constexpr float kInt16Max = 32767.0f;
// Blocks summed in int32 before the lanes are flushed to float. A `vpmaddwd` lane adds two
// products of |activation| <= 32767 and |code| <= 127, at most 2 * 32767 * 127 = 8,322,818 per
// block, so 256 blocks sum to at most 2,130,641,408 < 2^31 - 1 = 2,147,483,647: no K overflows.
constexpr int64_t kChunkBlocks = 256;
// Rows per tile: 4 rows x 2 channel pairs = 8 int32 accumulators, beside the widened weights and
// the products in AVX2's 16 registers (the activations are read from memory); at 4 x 3 GCC
// spilled accumulators to the stack.
constexpr int kMaxRowTile = 4;
// Multiply-adds per parallel task: below this a fork costs more than the work.
constexpr int64_t kTaskMacs = 1 << 17;
// Weight bytes one task's channel block keeps in L2 while every row tile passes over it
// (prefill).
constexpr int64_t kBlockBytes = 128 * 1024;
// Up to baton::kChunkRows rows (a decode step's), the row tiles pass over a group's weights a
// chunk of kDecodeChunkBlocks k blocks at a time (3 KiB, in L1) instead of block by block
// (linear_kernels.h's over_weight_chunks). It divides kChunkBlocks.
constexpr int64_t kDecodeChunkBlocks = 32;
static_assert(kChunkBlocks % kDecodeChunkBlocks == 0, "a decode chunk never spans a flush");
// How far ahead of the tile its weight stream is prefetched: 16 blocks of a group. At one row
// the hardware prefetcher alone left the stream short of DRAM's pace (docs/benchmarks.md).
constexpr int64_t kPrefetchBytes = 16 * kGroup * kLanes;
// Activations quantized per parallel task.
constexpr int64_t kTaskValues = 1 << 15;

#if defined(__AVX2__)
using IVec = __m256i;  // 8 int32 lanes: lanes 0-3 one channel's pair sums, 4-7 its neighbour's
using FVec = __m256;
inline IVec izero() { return _mm256_setzero_si256(); }
inline FVec fzero() { return _mm256_setzero_ps(); }
// A channel pair's 8 codes each, widened to 16 int16.
inline IVec load_pair(const int8_t* w) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}
inline IVec madd(IVec acc, IVec w, const int16_t* x) {
  const IVec xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
#if defined(__AVXVNNI__)
  // VNNI's `vpdpwssd` is the same pair products and int32 add in one instruction.
  return _mm256_dpwssd_avx_epi32(acc, w, xv);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, w, xv);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, xv));
#endif
}
inline FVec flush(FVec f, IVec i) { return _mm256_add_ps(f, _mm256_cvtepi32_ps(i)); }
// Each channel's (l0 + l1) + (l2 + l3).
inline void channel_sums(FVec f, float* pair) {
  const FVec h = _mm256_hadd_ps(f, f);
  const FVec s = _mm256_hadd_ps(h, h);
  pair[0] = _mm256_cvtss_f32(s);
  pair[1] = _mm_cvtss_f32(_mm256_extractf128_ps(s, 1));
}
#else
// Without AVX2 the same arithmetic on arrays, for the compiler to vectorize as it can; the
// integer sums are exact and the float steps are in the same order, so the bits are the same.
struct IVec {
  int32_t v[kLanes];
};
struct FVec {
  float v[kLanes];
};
inline IVec izero() { return IVec{}; }
inline FVec fzero() { return FVec{}; }
inline IVec load_pair(const int8_t* w) {
  // Kept as bytes; `madd` widens them as it multiplies.
  IVec r;
  std::memcpy(r.v, w, 2 * kLanes);
  return r;
}
inline IVec madd(IVec acc, IVec w, const int16_t* x) {
  int8_t codes[2 * kLanes];
  std::memcpy(codes, w.v, 2 * kLanes);
  for (int i = 0; i < kLanes; ++i)
    acc.v[i] += codes[2 * i] * int32_t{x[2 * i]} + codes[2 * i + 1] * int32_t{x[2 * i + 1]};
  return acc;
}
inline FVec flush(FVec f, IVec i) {
  for (int l = 0; l < kLanes; ++l) f.v[l] += static_cast<float>(i.v[l]);
  return f;
}
inline void channel_sums(FVec f, float* pair) {
  for (int c = 0; c < 2; ++c) {
    const float* l = f.v + 4 * c;
    pair[c] = (l[0] + l[1]) + (l[2] + l[3]);
  }
}
#endif

// The largest |x| of a row by its bits: for non-negative floats the integer order is the float
// order, and NaN and infinity sort above every finite value instead of dropping out of a max.
// Why not std::max and std::nearbyint below: under this file's optimize pragma GCC no longer
// inlines <cmath>'s and <algorithm>'s functions, and a call per activation cost microseconds.
inline uint32_t abs_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits & 0x7fffffffu;
}

inline uint32_t row_amax_bits(const float* x, int64_t K) {
  uint32_t amax = 0;
  int64_t k = 0;
#if defined(__AVX2__)
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i top = _mm256_setzero_si256();
  for (; k + kLanes <= K; k += kLanes) {
    const __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + k));
    top = _mm256_max_epi32(top, _mm256_and_si256(bits, mask));
  }
  alignas(32) uint32_t lanes[kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), top);
  for (uint32_t lane : lanes) amax = amax < lane ? lane : amax;
#endif
  for (; k < K; ++k) amax = amax < abs_bits(x[k]) ? abs_bits(x[k]) : amax;
  return amax;
}

// One activation rounded to int16, half to even as the vector conversion under the default
// rounding mode; |v| <= 32767 up to a float rounding, which the rounding takes back.
inline int16_t round_int16(float v) { return static_cast<int16_t>(__builtin_nearbyintf(v)); }

// One row as int16 at its own scale, into `q` (k_blocks blocks, each 8 values twice, the tail
// zero); returns the scale, 0 for an all-zero row and NaN for a row with a NaN or infinity (its
// outputs are then NaN, where the reference has NaN or infinities).
float quantize_row(const float* x, int64_t K, int64_t k_blocks, int16_t* q) {
  const uint32_t amax = row_amax_bits(x, K);
  std::memset(q, 0, k_blocks * kBlockInts * sizeof(int16_t));
  if (amax >= 0x7f800000u) return __builtin_nanf("");
  float top;
  std::memcpy(&top, &amax, sizeof(top));
  if (top == 0.0f) return 0.0f;
  const float inv = kInt16Max / top;
  int64_t b = 0;
#if defined(__AVX2__)
  const __m256 vinv = _mm256_set1_ps(inv);
  for (; (b + 1) * kLanes <= K; ++b) {
    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + b * kLanes), vinv));
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    const __m128i packed = _mm_packs_epi32(lo, hi);  // never saturates: |v| <= 32767
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kBlockInts),
                        _mm256_set_m128i(packed, packed));
  }
#endif
  for (int64_t k = b * kLanes; k < K; ++k) {
    int16_t* block = q + (k / kLanes) * kBlockInts + k % kLanes;
    block[0] = block[kLanes] = round_int16(x[k] * inv);
  }
  return top / kInt16Max;
}

struct Problem {
  const int16_t* xq;  // [M][k_blocks][16], `quantize_row`'s
  const float* x_scales;
  const int8_t* codes;  // packed: [groups][k_blocks][kGroup][kLanes]
  const float* scales;
  const float* bias;  // null when there is none
  float* out;
  int64_t N;
  int64_t k_blocks;  // ceil(K / kLanes)
};

// Where a tile keeps its sums between chunks on the decode path: each row's float and
// not-yet-flushed int32 sums of every channel pair of a group.
struct Carry {
  FVec acc[baton::kChunkRows][kPairs];
  IVec sum[baton::kChunkRows][kPairs];
};

// R rows from `m`, P channel pairs from pair `pair` of group `g`, over k blocks [b0, b1): every
// widened weight vector feeds R accumulators. A tile that starts past block 0 takes its sums
// from `carry`, one that stops short of the end leaves them there; the one that reaches the end
// writes the outputs. The int32 sums are flushed to the float ones at the same blocks whatever
// the chunks (every kChunkBlocks-th and the last), so carried or not, the sums are the same.
// A `lead` tile prefetches its stream.
template <int R, int P>
void tile(const Problem& p, int64_t m, int64_t g, int pair, int64_t b0, int64_t b1, Carry* carry,
          bool lead) {
  constexpr int64_t kStride = kGroup * kLanes;
  const int8_t* w = p.codes + g * p.k_blocks * kStride + pair * 2 * kLanes;
  const int16_t* x = p.xq + m * p.k_blocks * kBlockInts;
  const int64_t ldx = p.k_blocks * kBlockInts;
  FVec acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < P; ++c) acc[r][c] = b0 > 0 ? carry->acc[m + r][pair + c] : fzero();
  for (int64_t c0 = b0; c0 < b1;) {
    const int64_t c1 = std::min(b1, (c0 / kChunkBlocks + 1) * kChunkBlocks);
    const bool resumed = c0 % kChunkBlocks != 0;
    IVec sum[R][P];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < P; ++c) sum[r][c] = resumed ? carry->sum[m + r][pair + c] : izero();
    for (int64_t b = c0; b < c1; ++b) {
      const int8_t* wb = w + b * kStride;
      if (lead) __builtin_prefetch(wb + kPrefetchBytes);
      for (int c = 0; c < P; ++c) {
        const IVec wv = load_pair(wb + c * 2 * kLanes);
        for (int r = 0; r < R; ++r) {
          sum[r][c] = madd(sum[r][c], wv, x + r * ldx + b * kBlockInts);
        }
      }
    }
    if (c1 % kChunkBlocks == 0 || c1 == p.k_blocks) {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < P; ++c) acc[r][c] = flush(acc[r][c], sum[r][c]);
    } else {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < P; ++c) carry->sum[m + r][pair + c] = sum[r][c];
    }
    c0 = c1;
  }
  if (b1 < p.k_blocks) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < P; ++c) carry->acc[m + r][pair + c] = acc[r][c];
    return;
  }
  const int64_t n0 = g * kGroup + pair * 2;
  for (int r = 0; r < R; ++r) {
    float* o = p.out + (m + r) * p.N;
    const float sx = p.x_scales[m + r];
    for (int c = 0; c < P; ++c) {
      float dots[2];
      channel_sums(acc[r][c], dots);
      for (int h = 0; h < 2; ++h) {
        const int64_t n = n0 + 2 * c + h;
        if (n >= p.N) break;  // the last group's padding channels
        // fma always: left to the compiler, `a * b + c` may be fused in one tile and not another.
        const float v = dots[h] * sx;
        o[n] = p.bias ? __builtin_fmaf(v, p.scales[n], p.bias[n]) : v * p.scales[n];
      }
    }
  }
}

// Groups [g_begin, g_end) for R rows over k blocks [b0, b1), P channel pairs a tile.
template <int R, int P>
void row_tile(const Problem& p, int64_t m, int64_t g_begin, int64_t g_end, int64_t b0,
              int64_t b1, Carry* carry, bool lead) {
  for (int64_t g = g_begin; g < g_end; ++g)
    for (int pair = 0; pair < kPairs; pair += P) tile<R, P>(p, m, g, pair, b0, b1, carry, lead);
}

// The widest channel tile whose accumulators fit the registers beside R rows'.
void rows(const Problem& p, int64_t m, int R, int64_t g_begin, int64_t g_end, int64_t b0,
          int64_t b1, Carry* carry, bool lead) {
  switch (R) {
    case 1: return row_tile<1, 6>(p, m, g_begin, g_end, b0, b1, carry, lead);
    case 2: return row_tile<2, 3>(p, m, g_begin, g_end, b0, b1, carry, lead);
    case 3: return row_tile<3, 2>(p, m, g_begin, g_end, b0, b1, carry, lead);
    default: return row_tile<4, 2>(p, m, g_begin, g_end, b0, b1, carry, lead);
  }
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const c10::optional<at::Tensor>& bias) {
  baton::check_linear_input(x);
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
  const float* bias_data = baton::checked_bias(bias, N);
  auto out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  auto xq = at::empty({M, k_blocks * kBlockInts}, x.options().dtype(at::kShort));
  auto x_scales = at::empty({M}, x.options());
  const float* xp = x.data_ptr<float>();
  int16_t* xqp = xq.data_ptr<int16_t>();
  float* sp = x_scales.data_ptr<float>();
  const int64_t ldx = x.stride(0);
  const int64_t row_grain = std::max<int64_t>(1, kTaskValues / std::max<int64_t>(K, 1));
  at::parallel_for(0, M, row_grain, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      sp[m] = quantize_row(xp + m * ldx, K, k_blocks, xqp + m * k_blocks * kBlockInts);
  });
  const Problem p{xqp, sp, codes.data_ptr<int8_t>(), scales.data_ptr<float>(),
                  bias_data, out.data_ptr<float>(),
                  N, k_blocks};
  const int64_t macs_per_group = std::max<int64_t>(1, kGroup * k_blocks * kLanes * M);
  const int64_t grain = std::max<int64_t>(1, kTaskMacs / macs_per_group);
  const int64_t block = std::max<int64_t>(1, kBlockBytes / (kGroup * k_blocks * kLanes));
  baton::over_rows<Carry>(
      groups, grain, k_blocks, kDecodeChunkBlocks, block, M, kMaxRowTile,
      [&](Carry& carry, int64_t m, int r, int64_t g, int64_t b0, int64_t b1, bool lead) {
        rows(p, m, r, g, g + 1, b0, b1, &carry, lead);
      },
      [&](int64_t m, int r, int64_t g, int64_t g_end) {
        rows(p, m, r, g, g_end, 0, k_blocks, nullptr, true);
      });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(baton_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scales, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(baton_cpu, CPU, m) { m.impl("int8_linear", &int8_linear); }
