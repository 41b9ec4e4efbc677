// Float32 linear on the CPU: out[m, n] = sum_k x[m, k] * weight[n, k] (+ bias[n]), over the
// weight in the packed layout kernels/f32_linear.py's `pack_weight` makes once at load. The
// reference is `F.linear`.
//
// A decode step reads every weight once, so at a few rows the weights' read is the step. The
// packed layout, [ceil(N / 16), K, 16], stores a panel of 16 output channels per group, k by k:
// a tile walks its group's panel as one sequential stream (one cache line per k), and each
// weight vector loaded feeds every row of the tile, whose activations are broadcast one k at a
// time. At decode sizes every row tile passes over a chunk of a panel while it is in L1, so the
// weights stream from DRAM once whatever the rows; at prefill sizes a block of panels stays in
// L2 while every row tile passes over it. Padding channels are zeros. With AVX-512 a panel's
// line is one vector and a tile takes up to 12 rows, from 4 rows two panels side by side (a
// prefill tile up to 8 rows of them); with AVX2 it is two vectors and 6 rows.
//
// A gated MLP's gate and up projections run as one linear whose packed panels hold 8 gate
// channels and the same 8 up channels (kernels/f32_linear.py's `pack_gated_weight`): a tile then
// ends with both sums of each of its 8 outputs and writes act(gate) * up itself
// (`f32_gated_linear`), where the linear would write both sums and `silu_and_mul` read them back
// (at a 2,048-token prefill of the 0.4B Llama, 80 MB written and read per layer). The gate is
// silu_and_mul's own code (gates.h), so the floats are the same.
//
// Batch invariance: each output lane is one float32 accumulator fed by fused multiply-adds in
// k order, then the same bias add; whatever the tile shape, the number of rows, the thread
// split or the vector width, a row's bits are the same. So one kernel serves every row count
// (a switch to another library by row count would give a row different bits alone and
// batched).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "gates.h"
#include "linear_kernels.h"
#include "tuning.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

// Each sum below is ordered by hand.
#include "ordered_sums.h"

namespace {

namespace tuning = baton::tuning;

// Output channels per group: one 64-byte cache line per k.
constexpr int64_t kGroup = 16;
// The schedule's sizes are tuning.h's kF32 values. A parallel task takes at least kF32TaskMacs
// multiply-adds. At prefill sizes a block of kF32BlockBytes of panels stays in L2 while every
// row tile passes over it; up to tuning::kChunkRows rows (a decode step's) the row tiles pass
// over a group's panel a chunk of kF32ChunkSteps k steps at a time instead, in L1
// (linear_kernels.h's over_weight_chunks).
//
// How far ahead of its stream a tile prefetches depends on the pass. Where one tile passes over
// all of K, kF32PrefetchSteps: the hardware prefetcher alone keeps too few lines in flight once
// the multiply-adds of several rows slow the stream. Where several row tiles pass over each
// chunk in turn, the first prefetches kF32SharedPrefetchSteps ahead, and the second the next
// chunk's line at its own step (a chunk ahead), so the stream goes on while the tiles after the
// first pass over the chunk from L1. Prefill tiles, each passing over its block's panels from
// L2, prefetch kF32PrefillPrefetchSteps ahead.
//
// Tiles of kF32UnrollRows rows and more unroll their k loop by two: a step's address
// arithmetic, loop counter and prefetch test then come once per two steps, and on Intel cores
// they share ports with the multiply-adds. Below it the tiles wait on the multiply-adds'
// latency or on DRAM, and unrolled they run slower.

// Where a tile keeps its accumulators between chunks: a group's outputs for every row, and
// after them the next group's, for the tiles that take two panels.
constexpr int64_t kCarryPanel = tuning::kChunkRows * kGroup;
struct Carry {
  float acc[2 * kCarryPanel];
};

// The vector instructions a tile runs on. Each is the same fused multiply-add per lane, so a
// row's bits do not depend on which one ran it.
#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
  using Vec = __m256;
  static constexpr const char* kName = "avx2";
  static constexpr int kLanes = 8;
  // 6 rows x 2 vectors = 12 accumulators, which with 2 weight vectors and a broadcast
  // activation fill AVX2's 16 registers.
  static constexpr int kMaxRows = 6;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Vec fma(Vec a, Vec b, Vec acc) { return _mm256_fmadd_ps(a, b, acc); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  // A non-temporal store; `p` is 32-byte aligned.
  static void stream(float* p, Vec v) { _mm256_stream_ps(p, v); }
  // Keeps the weight vectors in registers. Left alone, GCC folds their loads into every fused
  // multiply-add of a tile of 2 to 4 rows: 8 loads a k instead of 2 where 4 rows multiply, more
  // than the load ports keep up with (a 4-row tile ran slower than a 5-row one). Only there: in
  // the 5- and 6-row tiles GCC keeps them in registers itself, and pinning them there was
  // slower.
  static void pin(Vec& lo, Vec& hi) { __asm__("" : "+x"(lo), "+x"(hi)); }
};
#endif
#if defined(__AVX512F__)
struct Avx512 {
  using Vec = __m512;
  static constexpr const char* kName = "avx512";
  // A panel's line is one vector.
  static constexpr int kLanes = 16;
  // 12 accumulators and the weight vector leave most of the 32 registers free; each weight
  // vector loaded feeds 12 rows' multiply-adds, whose activations are broadcast from memory
  // within the instruction.
  static constexpr int kMaxRows = 12;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Vec fma(Vec a, Vec b, Vec acc) { return _mm512_fmadd_ps(a, b, acc); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  // A non-temporal store; `p` is 64-byte aligned.
  static void stream(float* p, Vec v) { _mm512_stream_ps(p, v); }
};
#endif
// Without AVX2 the same arithmetic on 8-lane arrays, for the compiler to vectorize as it can;
// the order per output is still fixed by the code, not by the batch.
struct Portable {
  static constexpr const char* kName = "portable";
  static constexpr int kLanes = 8;
  static constexpr int kMaxRows = 6;
  struct Vec {
    float v[kLanes];
  };
  static Vec zero() { return Vec{}; }
  static Vec load(const float* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = p[i];
    return r;
  }
  static Vec broadcast(const float* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = *p;
    return r;
  }
  static Vec fma(Vec a, Vec b, Vec acc) {
    // Fused always: left to the compiler, `acc + a * b` may be fused in one tile and not
    // another.
    for (int i = 0; i < kLanes; ++i) acc.v[i] = std::fma(a.v[i], b.v[i], acc.v[i]);
    return acc;
  }
  static void store(float* p, Vec v) { std::memcpy(p, v.v, sizeof(v.v)); }
  static Vec add(Vec a, Vec b) {
    for (int i = 0; i < kLanes; ++i) a.v[i] += b.v[i];
    return a;
  }
  static void stream(float* p, Vec v) { store(p, v); }
  static void pin(Vec&, Vec&) {}
};

// Tiles of several rows run on the widest vectors; a one-row tile, which at decode sizes only
// streams its panel from DRAM, on AVX2's even where there is AVX-512: its one AVX-512
// accumulator chain streams slower than AVX2's two.
#if defined(__AVX512F__)
using Wide = Avx512;
using Narrow = Avx2;
#elif defined(__AVX2__) && defined(__FMA__)
using Wide = Avx2;
using Narrow = Avx2;
#else
using Wide = Portable;
using Narrow = Portable;
#endif
constexpr int kMaxRowTile = Wide::kMaxRows;
// Rows of a prefill tile: where a panel's line is one vector, tiles of two panels (row_tile).
constexpr int kPrefillMaxRowTile =
    Wide::kLanes == kGroup ? tuning::kF32PrefillPairRows : kMaxRowTile;

struct Problem {
  const float* x;
  int64_t ldx;
  const float* weight;  // packed: [groups][K][kGroup]
  const float* bias;    // null when there is none
  float* out;
  // N: the outputs a row (its length in `out`); gated, half the packed channels.
  int64_t K, N;
  // With a gate, the weight is in the gated layout, whose tiles write act(gate) * up of each
  // pair of sums rather than the sums.
  std::optional<baton::Gate> gate;
  // Whether a group's outputs, where they fill an aligned cache line, are written with
  // non-temporal stores (see `write_outputs`).
  bool stream_out;
  // How far ahead the first tile of a chunk (turn 0) prefetches its weights, in k steps.
  int64_t prefetch_steps;
};

// A gated layout's tile end: group `g`'s line is 8 gate sums, then the 8 up sums of the same
// outputs, and rows [m, m + R) get act(gate) * up for outputs [8g, 8g + 8): half a cache line a
// row, written, at decode sizes, with non-temporal stores as write_outputs says: with plain
// ones the fused pass runs slower than the unfused linear and gate.
template <class V, int R>
void write_gated(const Problem& p, int64_t m, int64_t g, const typename V::Vec (&acc)[12][2],
                 int first) {
  constexpr int kLanes = V::kLanes, kVecs = kGroup / kLanes;
  constexpr int64_t kHalf = kGroup / 2;
  const int64_t n = g * kHalf, width = std::min<int64_t>(kHalf, p.N - n);
  float sums[R][kGroup];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < kVecs; ++v) V::store(sums[r] + v * kLanes, acc[r][first + v]);
  }
  float* o = p.out + m * p.N + n;
#if defined(__AVX2__)
  // Every row's 8 outputs aligned: N a multiple of 8 (so every group is whole) and row m's.
  if (p.stream_out && p.N % kHalf == 0 && reinterpret_cast<uintptr_t>(o) % 32 == 0) {
    alignas(32) float gated[R][kHalf];
    baton::gate_rows(*p.gate, sums[0], kGroup, kHalf, gated[0], kHalf, R, kHalf);
    for (int r = 0; r < R; ++r) _mm256_stream_ps(o + r * p.N, _mm256_load_ps(gated[r]));
    return;
  }
#endif
  baton::gate_rows(*p.gate, sums[0], kGroup, kHalf, o, p.N, R, width);
}

// Writes a tile's sums (plus the bias) for rows [m, m + R) of group `g`: row r's line is
// acc[r][first], acc[r][first + 1] (the latter where a line is two vectors). At decode sizes the
// weights stream from DRAM and a row's outputs for a group are written once, a whole cache line
// of them, long after that line left the caches: a plain store first reads the line (a
// read-for-ownership), one more DRAM miss per row and group in the middle of the weight stream.
// Non-temporal stores take the line without reading it, and the pass runs about as fast as with
// no output stores at all. The next op then reads the outputs from DRAM, once, in order.
// Prefill sizes keep plain stores: there the outputs are few against the arithmetic and their
// reader finds them in the cache. The same floats either way.
template <class V, int R>
void write_outputs(const Problem& p, int64_t m, int64_t g, const typename V::Vec (&acc)[12][2],
                   int first = 0) {
  if (p.gate) return write_gated<V, R>(p, m, g, acc, first);
  constexpr int kLanes = V::kLanes, kVecs = kGroup / kLanes;
  const int64_t n = g * kGroup, width = std::min<int64_t>(kGroup, p.N - n);
  for (int r = 0; r < R; ++r) {
    float* o = p.out + (m + r) * p.N + n;
    if (p.stream_out && width == kGroup && reinterpret_cast<uintptr_t>(o) % 64 == 0) {
      for (int v = 0; v < kVecs; ++v) {
        const typename V::Vec line = acc[r][first + v];
        const typename V::Vec sum = p.bias ? V::add(line, V::load(p.bias + n + v * kLanes)) : line;
        V::stream(o + v * kLanes, sum);
      }
      continue;
    }
    float sums[kGroup];
    for (int v = 0; v < kVecs; ++v) V::store(sums + v * kLanes, acc[r][first + v]);
    if (p.bias) {
      for (int64_t c = 0; c < width; ++c) o[c] = sums[c] + p.bias[n + c];
    } else {
      std::memcpy(o, sums, width * sizeof(float));
    }
  }
}

// R rows from `m` over steps [k0, k1) of group `g`'s panel (and with Panels = 2, of group g + 1's
// beside it, at the same k): each weight vector loaded feeds R rows. A tile that starts past
// k = 0 takes its accumulators from `carry` (the tile's rows of it; the second panel's from the
// carry's second half), one that stops short of K leaves them there; the one that reaches K
// writes the outputs. Carried through memory, the sums are the same floats as kept in
// registers. The tile of `turn` 0 (at decode sizes a chunk's first, in prefill every tile)
// prefetches its streams `p.prefetch_steps` ahead, that of turn 1 (a chunk's second) a chunk
// ahead. The accumulators are named variables (a for a panel's
// first vector, b for its second where a vector is 8 lanes, or for the second panel's), not an
// array: GCC kept an array of them on the stack and stored all of them every k
// (docs/decisions.md).
template <class V, int R, int Panels = 1>
void tile(const Problem& p, int64_t m, int64_t g, int64_t k0, int64_t k1, float* carry,
          int turn) {
  using Vec = typename V::Vec;
  constexpr int kLanes = V::kLanes, kVecs = kGroup / kLanes;
  static_assert(Panels == 1 || (kVecs == 1 && R <= 12), "two panels where a line is a vector");
  // The b accumulators take a panel line's second vector, or the next panel's line.
  constexpr bool kSecond = kVecs == 2 || Panels == 2;
  const int64_t second = Panels == 2 ? p.K * kGroup : kLanes;
  static_assert(R >= 1 && R <= V::kMaxRows && V::kMaxRows <= 12, "a tile is 1-12 rows");
  static_assert(kVecs == 1 || kVecs == 2, "a panel's line is one or two vectors");
  const Vec z = V::zero();
  Vec a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z, a8 = z, a9 = z, a10 = z;
  Vec a11 = z, b0 = z, b1 = z, b2 = z, b3 = z, b4 = z, b5 = z, b6 = z, b7 = z, b8 = z, b9 = z;
  Vec b10 = z, b11 = z;
  // The carried sums of the a and the b accumulators: a line's two vectors side by side, or
  // the second panel's in the carry's second half.
  float* c = carry ? carry + m * kGroup : nullptr;
  float* cb = carry ? (Panels == 2 ? c + kCarryPanel : c + kLanes) : nullptr;
  // Rows past R, and the second vectors where there are none, are dropped at compile time.
#define BATON_ROWS(ROW) \
  ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7) ROW(8) ROW(9) ROW(10) ROW(11)
#define BATON_TAKE(r)                                              \
  if (R > r) {                                                     \
    a##r = V::load(c + r * kGroup);                                \
    if constexpr (kSecond) b##r = V::load(cb + r * kGroup);        \
  }
  if (k0 > 0) {
    BATON_ROWS(BATON_TAKE)
  }
#undef BATON_TAKE
  const float* x = p.x + m * p.ldx;
  const float* w = p.weight + (g * p.K + k0) * kGroup;
  const int64_t ldx = p.ldx;
  // A chunk's first tile prefetches `p.prefetch_steps` ahead, its second the next chunk's line
  // at its own step, the others nothing.
  const bool prefetches = turn <= 1;
  const int64_t ahead = (turn == 0 ? p.prefetch_steps : tuning::kF32ChunkSteps) * kGroup;
#define BATON_ROW(r)                                       \
  if (R > r) {                                             \
    const Vec xv = V::broadcast(xk + r * ldx);             \
    a##r = V::fma(xv, lo, a##r);                           \
    if constexpr (kSecond) b##r = V::fma(xv, hi, b##r);    \
  }
#define BATON_STEP                                                                  \
  if (prefetches) {                                                                 \
    __builtin_prefetch(w + ahead);                                                  \
    if constexpr (Panels == 2) __builtin_prefetch(w + second + ahead);              \
  }                                                                                 \
  Vec lo = V::load(w), hi = kSecond ? V::load(w + second) : lo;                     \
  if constexpr (kVecs == 2 && R <= 4) V::pin(lo, hi);                               \
  const float* xk = x + k;                                                          \
  BATON_ROWS(BATON_ROW)
  // Two copies of the loop: GCC's unroll pragma takes no count that depends on R.
  if constexpr (R >= tuning::kF32UnrollRows) {
#pragma GCC unroll 2
    for (int64_t k = k0; k < k1; ++k, w += kGroup) {
      BATON_STEP
    }
  } else {
    for (int64_t k = k0; k < k1; ++k, w += kGroup) {
      BATON_STEP
    }
  }
#undef BATON_STEP
#undef BATON_ROW
  if (k1 < p.K) {
#define BATON_LEAVE(r)                                       \
  if (R > r) {                                               \
    V::store(c + r * kGroup, a##r);                          \
    if constexpr (kSecond) V::store(cb + r * kGroup, b##r);  \
  }
    BATON_ROWS(BATON_LEAVE)
#undef BATON_LEAVE
    return;
  }
#undef BATON_ROWS
  const Vec acc[12][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}, {a4, b4},   {a5, b5},
                          {a6, b6}, {a7, b7}, {a8, b8}, {a9, b9}, {a10, b10}, {a11, b11}};
  write_outputs<V, R>(p, m, g, acc);
  // Two panels: the b accumulators are group g + 1's line.
  if constexpr (Panels == 2) write_outputs<V, R>(p, m, g + 1, acc, 1);
}

// R rows over steps [k0, k1) of groups [g_begin, g_end). Where a panel's line is one vector,
// tiles take two panels at a time: each broadcast activation then feeds two multiply-adds, and a
// k step loads R + 2 values for 2R of them instead of R + 1 for R, which bound the one-panel
// tiles wherever the arithmetic and not DRAM set the pace. Prefill tiles (no carry: each runs
// the whole of K) take them up to tuning::kF32PrefillPairRows rows, two panels' 16 accumulators
// at 8; decode tiles where over_weight_chunks hands them two groups, from
// tuning::kF32DecodePairRows rows: below it the weights' stream sets the pace, and two streams
// at a time run slower than one.
template <int R>
void row_tile(const Problem& p, int64_t m, int64_t g_begin, int64_t g_end, int64_t k0,
              int64_t k1, float* carry, int turn) {
  using V = std::conditional_t<R == 1, Narrow, Wide>;
  int64_t g = g_begin;
  if constexpr (V::kLanes == kGroup) {
    if (carry != nullptr || R <= tuning::kF32PrefillPairRows) {
      for (; g + 1 < g_end; g += 2) tile<V, R, 2>(p, m, g, k0, k1, carry, turn);
    }
  }
  for (; g < g_end; ++g) tile<V, R>(p, m, g, k0, k1, carry, turn);
}

// The tile of R rows, R known at compile time (tiles past kMaxRowTile never come).
template <int R = 1>
void rows(const Problem& p, int64_t m, int r, int64_t g_begin, int64_t g_end, int64_t k0,
          int64_t k1, float* carry, int turn) {
  if constexpr (R < kMaxRowTile) {
    if (r > R) return rows<R + 1>(p, m, r, g_begin, g_end, k0, k1, carry, turn);
  }
  row_tile<R>(p, m, g_begin, g_end, k0, k1, carry, turn);
}

// out = x W^T (+ bias) over `groups` packed channel groups, `N` outputs a row (gated: the
// gate applied to each of the groups' 8 sum pairs).
at::Tensor run(const at::Tensor& x, const at::Tensor& weight, const float* bias, int64_t N,
               int64_t groups, std::optional<baton::Gate> gate) {
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "the weight is contiguous float32, packed by baton.kernels.f32_linear.pack_weight");
  TORCH_CHECK(weight.dim() == 3 && weight.size(0) == groups && weight.size(1) == K &&
                  weight.size(2) == kGroup,
              "the weight is packed [", groups, ", in, 16] with in = x's columns: ",
              gate ? "[ceil(intermediate / 8), in, 16] (pack_gated_weight)"
                   : "[ceil(out / 16), in, 16] for out = out_features");
  auto out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  const Problem p{x.data_ptr<float>(), x.stride(0), weight.data_ptr<float>(),
                  bias, out.data_ptr<float>(), K, N, gate, baton::decode_sized(M),
                  M <= kMaxRowTile       ? tuning::kF32PrefetchSteps
                  : baton::decode_sized(M) ? tuning::kF32SharedPrefetchSteps
                                           : tuning::kF32PrefillPrefetchSteps};
  const int64_t macs_per_group = std::max<int64_t>(1, kGroup * K * M);
  const int64_t grain = std::max<int64_t>(1, tuning::kF32TaskMacs / macs_per_group);
  const int64_t panel_bytes = kGroup * std::max<int64_t>(K, 1) * sizeof(float);
  const int64_t block = std::max<int64_t>(1, tuning::kF32BlockBytes / panel_bytes);
  baton::over_rows<Carry>(
      groups, grain, K, tuning::kF32ChunkSteps, block, M, K * static_cast<int64_t>(sizeof(float)),
      kMaxRowTile, kPrefillMaxRowTile,
      Wide::kLanes == kGroup && M >= tuning::kF32DecodePairRows ? 2 : 1,
      [&](Carry& carry, int64_t m, int r, int64_t g, int64_t g_end, int64_t k0, int64_t k1,
          int turn) { rows(p, m, r, g, g_end, k0, k1, carry.acc, turn); },
      [&](int64_t m, int r, int64_t g, int64_t g_end) {
        rows(p, m, r, g, g_end, 0, K, nullptr, 0);
      });
  return out;
}

at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& weight,
                      const c10::optional<at::Tensor>& bias, int64_t out_features) {
  baton::check_linear_input(x);
  const float* bias_data = baton::checked_bias(bias, out_features);
  return run(x, weight, bias_data, out_features, (out_features + kGroup - 1) / kGroup,
             std::nullopt);
}

// act(x W_gate^T) * (x W_up^T) for a gated MLP, over pack_gated_weight's layout of its
// [gate | up] weight: [rows, intermediate_size].
at::Tensor f32_gated_linear(const at::Tensor& x, const at::Tensor& weight,
                            int64_t intermediate_size, bool gelu) {
  baton::check_linear_input(x);
  TORCH_CHECK(intermediate_size >= 0, "intermediate_size is not negative");
  constexpr int64_t kHalf = kGroup / 2;
  return run(x, weight, nullptr, intermediate_size, (intermediate_size + kHalf - 1) / kHalf,
             gelu ? baton::Gate::kGeluTanh : baton::Gate::kSilu);
}

// The vector code this build's tiles of several rows run on: "avx512", "avx2" or "portable".
// kernels/f32_linear.py reads it to leave the float linears to oneDNN where it is "portable".
std::string f32_linear_isa() { return Wide::kName; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(baton_cpu, m) {
  m.def("f32_linear(Tensor x, Tensor weight, Tensor? bias, int out_features) -> Tensor");
  m.def("f32_gated_linear(Tensor x, Tensor weight, int intermediate_size, bool gelu) -> Tensor");
  // No tensor to dispatch on: one kernel for every backend.
  m.def("f32_linear_isa() -> str", &f32_linear_isa);
}

TORCH_LIBRARY_IMPL(baton_cpu, CPU, m) {
  m.impl("f32_linear", &f32_linear);
  m.impl("f32_gated_linear", &f32_gated_linear);
}
