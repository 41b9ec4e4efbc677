// Weight-only int8 linear on the CPU: out[m, n] = scales[n] * sum_k x[m, k] * codes[n, k]
// (+ bias[n]), float32 activations, int8 codes with one float32 scale per output channel, in the
// packed layout kernels/int8_linear.py's `pack_codes` makes. The reference is `int8_linear_ref`.
//
// A decode step is memory bound only if the kernel keeps up with memory: widening each weight to
// float and multiplying in float32 costs 3 vector instructions per 8 weights, and at one row that
// is slower than DRAM. So each activation row is quantized once per call to int16 (symmetric,
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
// gives 4 pair sums of each channel. With AVX-512 a vector takes two such pairs (32 codes) and
// the activations broadcast to both halves, twice the work an instruction. Padding channels and
// the K tail are zero codes, and the quantized rows are zero-padded too, so every tile runs
// whole blocks of whole channel pairs.
//
// Batch invariance: a row's quantization depends on the row alone, integer sums are exact in any
// order, and the float steps (each chunk's int32 lanes added to float lanes in k order, then the
// same 4-lane sum per channel and the same scaling) are fixed by the code; whatever the tile
// shape, the number of rows or the thread split, a row's bits are the same.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "linear_kernels.h"
#include "tuning.h"

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

namespace tuning = baton::tuning;

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
// The schedule's sizes are tuning.h's kInt8 values. A parallel task takes at least
// kInt8TaskMacs multiply-adds, and quantizes at least kInt8TaskValues activations. At prefill
// sizes a block of kInt8BlockBytes of codes stays in L2 while every row tile passes over it; up
// to tuning::kChunkRows rows (a decode step's) the row tiles pass over a group's codes a chunk
// of kInt8DecodeChunkBlocks k blocks at a time instead, in L1 (linear_kernels.h's
// over_weight_chunks).
static_assert(kChunkBlocks % tuning::kInt8DecodeChunkBlocks == 0,
              "a decode chunk never spans a flush");
// How far ahead of the tile its weight stream is prefetched: where one row tile passes over all
// of K (up to kMaxRowTile rows), kInt8PrefetchBlocks, since the hardware prefetcher alone leaves
// the stream short of DRAM's pace; where several row tiles take turns over each chunk, and in
// prefill, kInt8SharedPrefetchBlocks.
constexpr int64_t kPrefetchBytes = tuning::kInt8PrefetchBlocks * kGroup * kLanes;
constexpr int64_t kSharedPrefetchBytes = tuning::kInt8SharedPrefetchBlocks * kGroup * kLanes;

// The vector instructions a tile runs on. A kind's vector holds kPairsPerVec channel pairs of
// 8 lanes each (lanes 0-3 of a pair one channel's partial sums, 4-7 its neighbour's), as int32
// sums (I) or float sums (F). Every kind computes the same integers and the same float steps
// per lane, so a row's bits do not depend on which one ran it. `tile_pairs<R>` is how many of a
// group's 6 channel pairs a tile of R rows takes: as many as the registers hold beside R rows'.
#if defined(__AVX2__)
struct Avx2 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kPairsPerVec = 1;
  // 4 rows x 2 channel pairs = 8 int32 accumulators, beside the widened weights and the
  // products in AVX2's 16 registers (the activations are read from memory); at 4 x 3 GCC
  // spilled accumulators to the stack.
  static constexpr int kMaxRows = 4;
  template <int R>
  static constexpr int tile_pairs = R == 1 ? 6 : R == 2 ? 3 : 2;
  static I izero() { return _mm256_setzero_si256(); }
  static F fzero() { return _mm256_setzero_ps(); }
  // A channel pair's 8 codes each, widened to 16 int16.
  static I load_codes(const int8_t* w) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  }
  static I madd(I acc, I w, const int16_t* x) {
    const I xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
#if defined(__AVXVNNI__)
    // VNNI's `vpdpwssd` is the same pair products and int32 add in one instruction.
    return _mm256_dpwssd_avx_epi32(acc, w, xv);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, w, xv);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, xv));
#endif
  }
  static F flush(F f, I i) { return _mm256_add_ps(f, _mm256_cvtepi32_ps(i)); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static I load(const int32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store(int32_t* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  // Each channel's (l0 + l1) + (l2 + l3).
  static void channel_sums(F f, float* sums) {
    const F h = _mm256_hadd_ps(f, f);
    const F s = _mm256_hadd_ps(h, h);
    sums[0] = _mm256_cvtss_f32(s);
    sums[1] = _mm_cvtss_f32(_mm256_extractf128_ps(s, 1));
  }
};
#endif
#if defined(__AVX2__) && defined(__AVX512BW__)
// Two channel pairs a vector: each widened code vector and each multiply-add does twice
// AVX2's work, and a tile takes all 6 pairs (3 vectors a row).
struct Avx512 {
  using I = __m512i;
  using F = __m512;
  static constexpr int kPairsPerVec = 2;
  // Rows x 3 vectors of int32 accumulators, beside the 3 widened code vectors and the broadcast
  // activations in the 32 registers: 6 rows, 18 accumulators, where tiles of 8 rows (24) run
  // slower, and so do tiles of 4.
  static constexpr int kMaxRows = tuning::kInt8Avx512MaxRows;
  template <int R>
  static constexpr int tile_pairs = 6;
  static I izero() { return _mm512_setzero_si512(); }
  static F fzero() { return _mm512_setzero_ps(); }
  // Two channel pairs' 8 codes each (32 bytes), widened to 32 int16.
  static I load_codes(const int8_t* w) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  // The block's activations (8, stored twice) meet both pairs.
  static I madd(I acc, I w, const int16_t* x) {
    const I xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, w, xv);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, xv));
#endif
  }
  static F flush(F f, I i) { return _mm512_add_ps(f, _mm512_cvtepi32_ps(i)); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static I load(const int32_t* p) { return _mm512_loadu_si512(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(int32_t* p, I v) { _mm512_storeu_si512(p, v); }
  // Each pair's sums as Avx2 makes them, 4 channels.
  static void channel_sums(F f, float* sums) {
    Avx2::channel_sums(_mm512_castps512_ps256(f), sums);
    Avx2::channel_sums(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)),
                       sums + 2);
  }
};
#endif
// Without AVX2 the same arithmetic on arrays, for the compiler to vectorize as it can; the
// integer sums are exact and the float steps are in the same order, so the bits are the same.
struct Portable {
  struct I {
    int32_t v[kLanes];
  };
  struct F {
    float v[kLanes];
  };
  static constexpr int kPairsPerVec = 1;
  static constexpr int kMaxRows = 4;
  template <int R>
  static constexpr int tile_pairs = R == 1 ? 6 : R == 2 ? 3 : 2;
  static I izero() { return I{}; }
  static F fzero() { return F{}; }
  static I load_codes(const int8_t* w) {
    // Kept as bytes; `madd` widens them as it multiplies.
    I r;
    std::memcpy(r.v, w, 2 * kLanes);
    return r;
  }
  static I madd(I acc, I w, const int16_t* x) {
    int8_t codes[2 * kLanes];
    std::memcpy(codes, w.v, 2 * kLanes);
    for (int i = 0; i < kLanes; ++i)
      acc.v[i] += codes[2 * i] * int32_t{x[2 * i]} + codes[2 * i + 1] * int32_t{x[2 * i + 1]};
    return acc;
  }
  static F flush(F f, I i) {
    for (int l = 0; l < kLanes; ++l) f.v[l] += static_cast<float>(i.v[l]);
    return f;
  }
  static F load(const float* p) {
    F r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static I load(const int32_t* p) {
    I r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static void store(float* p, F v) { std::memcpy(p, v.v, sizeof(v.v)); }
  static void store(int32_t* p, I v) { std::memcpy(p, v.v, sizeof(v.v)); }
  static void channel_sums(F f, float* sums) {
    for (int c = 0; c < 2; ++c) {
      const float* l = f.v + 4 * c;
      sums[c] = (l[0] + l[1]) + (l[2] + l[3]);
    }
  }
};

#if defined(__AVX2__) && defined(__AVX512BW__)
using Kind = Avx512;
#elif defined(__AVX2__)
using Kind = Avx2;
#else
using Kind = Portable;
#endif
constexpr int kMaxRowTile = Kind::kMaxRows;

// The largest |x| of a row by its bits: for non-negative floats the integer order is the float
// order, and NaN and infinity sort above every finite value instead of dropping out of a max.
// Why not std::max and std::nearbyint below: under this file's optimize pragma GCC no longer
// inlines <cmath>'s and <algorithm>'s functions, and a call per activation costs far more than
// the activation's own work.
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
  // How far ahead a lead tile prefetches its weights.
  int64_t prefetch_bytes;
};

// Where a tile keeps its sums between chunks on the decode path: each row's float and
// not-yet-flushed int32 sums of every channel pair of a group, 8 lanes a pair. Aligned so that
// no vector's load or store of it splits a cache line.
struct alignas(64) Carry {
  float acc[tuning::kChunkRows][kPairs][kLanes];
  int32_t sum[tuning::kChunkRows][kPairs][kLanes];
};

// R rows from `m`, P channel pairs from pair `pair` of group `g`, over k blocks [b0, b1): every
// widened weight vector feeds R accumulators. A tile that starts past block 0 takes its sums
// from `carry`, one that stops short of the end leaves them there; the one that reaches the end
// writes the outputs. The int32 sums are flushed to the float ones at the same blocks whatever
// the chunks (every kChunkBlocks-th and the last), so carried or not, the sums are the same.
// A `lead` tile prefetches its stream.
template <class V, int R, int P>
void tile(const Problem& p, int64_t m, int64_t g, int pair, int64_t b0, int64_t b1, Carry* carry,
          bool lead) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int kVecPairs = V::kPairsPerVec;
  static_assert(P % kVecPairs == 0, "a tile takes whole vectors of channel pairs");
  constexpr int C = P / kVecPairs;  // vectors a row
  constexpr int64_t kStride = kGroup * kLanes;
  const int8_t* w = p.codes + g * p.k_blocks * kStride + pair * 2 * kLanes;
  const int16_t* x = p.xq + m * p.k_blocks * kBlockInts;
  const int64_t ldx = p.k_blocks * kBlockInts;
  // Carried sums of vector c of row r: its pairs' lanes, side by side.
  auto carried_acc = [&](int r, int c) { return carry->acc[m + r][pair + c * kVecPairs]; };
  auto carried_sum = [&](int r, int c) { return carry->sum[m + r][pair + c * kVecPairs]; };
  F acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = b0 > 0 ? V::load(carried_acc(r, c)) : V::fzero();
  for (int64_t c0 = b0; c0 < b1;) {
    const int64_t c1 = std::min(b1, (c0 / kChunkBlocks + 1) * kChunkBlocks);
    const bool resumed = c0 % kChunkBlocks != 0;
    I sum[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) sum[r][c] = resumed ? V::load(carried_sum(r, c)) : V::izero();
    // Unrolled by two: the block's address arithmetic, loop counter and prefetch test once per
    // two blocks, where on Intel cores they share ports with the multiply-adds.
#pragma GCC unroll 2
    for (int64_t b = c0; b < c1; ++b) {
      const int8_t* wb = w + b * kStride;
      if (lead) __builtin_prefetch(wb + p.prefetch_bytes);
      for (int c = 0; c < C; ++c) {
        const I wv = V::load_codes(wb + c * kVecPairs * 2 * kLanes);
        for (int r = 0; r < R; ++r) {
          sum[r][c] = V::madd(sum[r][c], wv, x + r * ldx + b * kBlockInts);
        }
      }
    }
    if (c1 % kChunkBlocks == 0 || c1 == p.k_blocks) {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = V::flush(acc[r][c], sum[r][c]);
    } else {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) V::store(carried_sum(r, c), sum[r][c]);
    }
    c0 = c1;
  }
  if (b1 < p.k_blocks) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) V::store(carried_acc(r, c), acc[r][c]);
    return;
  }
  const int64_t n0 = g * kGroup + pair * 2;
  for (int r = 0; r < R; ++r) {
    float* o = p.out + (m + r) * p.N;
    const float sx = p.x_scales[m + r];
    for (int c = 0; c < C; ++c) {
      float dots[2 * kVecPairs];
      V::channel_sums(acc[r][c], dots);
      for (int h = 0; h < 2 * kVecPairs; ++h) {
        const int64_t n = n0 + 2 * kVecPairs * c + h;
        if (n >= p.N) break;  // the last group's padding channels
        // fma always: left to the compiler, `a * b + c` may be fused in one tile and not another.
        const float v = dots[h] * sx;
        o[n] = p.bias ? __builtin_fmaf(v, p.scales[n], p.bias[n]) : v * p.scales[n];
      }
    }
  }
}

// Groups [g_begin, g_end) for R rows over k blocks [b0, b1), the kind's channel pairs a tile.
template <int R>
void row_tile(const Problem& p, int64_t m, int64_t g_begin, int64_t g_end, int64_t b0,
              int64_t b1, Carry* carry, bool lead) {
  constexpr int P = Kind::tile_pairs<R>;
  static_assert(kPairs % P == 0, "a tile's channel pairs divide a group's");
  for (int64_t g = g_begin; g < g_end; ++g)
    for (int pair = 0; pair < kPairs; pair += P)
      tile<Kind, R, P>(p, m, g, pair, b0, b1, carry, lead);
}

// The tile of r rows, R known at compile time (tiles past kMaxRowTile never come).
template <int R = 1>
void rows(const Problem& p, int64_t m, int r, int64_t g_begin, int64_t g_end, int64_t b0,
          int64_t b1, Carry* carry, bool lead) {
  if constexpr (R < kMaxRowTile) {
    if (r > R) return rows<R + 1>(p, m, r, g_begin, g_end, b0, b1, carry, lead);
  }
  row_tile<R>(p, m, g_begin, g_end, b0, b1, carry, lead);
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const c10::optional<at::Tensor>& bias) {
  baton::check_linear_input(x);
  const int64_t M = x.size(0), K = x.size(1), N = scales.numel();
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous(),
              "scales are a contiguous float32 [out]");
  const int64_t groups = (N + kGroup - 1) / kGroup, k_blocks = (K + kLanes - 1) / kLanes;
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous(),
              "codes are contiguous int8, packed by baton.kernels.int8_linear.pack_codes");
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
  const int64_t row_grain =
      std::max<int64_t>(1, tuning::kInt8TaskValues / std::max<int64_t>(K, 1));
  baton::parallel_rows(M, row_grain, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      sp[m] = quantize_row(xp + m * ldx, K, k_blocks, xqp + m * k_blocks * kBlockInts);
  });
  const Problem p{xqp, sp, codes.data_ptr<int8_t>(), scales.data_ptr<float>(),
                  bias_data, out.data_ptr<float>(),
                  N, k_blocks, M <= kMaxRowTile ? kPrefetchBytes : kSharedPrefetchBytes};
  const int64_t macs_per_group = std::max<int64_t>(1, kGroup * k_blocks * kLanes * M);
  const int64_t grain = std::max<int64_t>(1, tuning::kInt8TaskMacs / macs_per_group);
  const int64_t block =
      std::max<int64_t>(1, tuning::kInt8BlockBytes / (kGroup * k_blocks * kLanes));
  baton::over_rows<Carry>(
      groups, grain, k_blocks, tuning::kInt8DecodeChunkBlocks, block, M,
      k_blocks * kBlockInts * static_cast<int64_t>(sizeof(int16_t)), kMaxRowTile, kMaxRowTile, 1,
      [&](Carry& carry, int64_t m, int r, int64_t g, int64_t g_end, int64_t b0, int64_t b1,
          int turn) { rows(p, m, r, g, g_end, b0, b1, &carry, turn == 0); },
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
