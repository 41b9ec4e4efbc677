// Attention read straight from the paged KV cache, for the CPU.
//
// A decode step's attention is memory traffic: every cached key and value of every running
// sequence is read once per layer, for a handful of flops each. The plain-torch path reads the
// cache, writes a contiguous copy (index_select) and reads that copy again in SDPA; this kernel
// reads each block where it lies, once, asking for the next block while it works on this one.
// A task is a tile of rows of one sequence (a decode row alone, or up to
// tuning::kAttentionTileRows rows of a prefill chunk) with all its KV heads, block by block, so
// each block is read front to back once; or one KV head of a tile when there are too few tiles
// to keep every thread busy. Each KV head's group of query heads, for every row of the tile, runs
// while the block's keys and values for that head sit in L1, with an online softmax per row and
// query head. A prefill chunk's keys, cached before the call, are read from L2. Against SDPA
// over a gathered copy this is faster up to a few hundred tokens and close to it past them
// (docs/decisions.md). The work for a head of a row is the same whatever the tile, the task
// split, the rest of the batch or the prefill's chunking, so a row's result has the same bits
// alone, in any batch, and whether it came as a prefill or a decode.
//
// Layouts (as kernels/paged_attention.py documents): q [T, Hq, D]; kv_cache [2, num_blocks,
// block_size, Hkv, D] contiguous; block_tables [num_seqs, width] int32 or int64. `rows[i]` is a
// row of q (and of out) of sequence `seqs[i]`, at position lens[i] - 1: it attends to the first
// lens[i] tokens of its blocks, or with `window` > 0 to the last `window` of them (blocks wholly
// before the window are not read). With `softcap` > 0 each scaled score s becomes
// softcap * tanh(s / softcap) (Gemma 2). With `sinks` ([Hq] float32, gpt-oss), each query head's
// sink logit joins its softmax's denominator as one more score with no value: it is folded in
// once the row's keys are done, so it changes nothing else. The cache is float32, or float16
// (`--kv-cache-dtype float16`): then each cached value is widened to float32 as it is loaded
// (a tile of several rows widens a block's head once, into L1), and the arithmetic is the
// float32 cache's on the same values.
//
// With AVX2, FMA and F16C (and a head_dim that is a multiple of 8) the scores and the weighted
// values are written in vector intrinsics: eight keys' dot products in eight registers reduced
// together, and the values accumulated in registers across a block. Otherwise, plain loops.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "fast_exp.h"
#include "half_convert.h"
#include "parallel_shares.h"
#include "tuning.h"

namespace {

namespace tuning = baton::tuning;

template <typename Elem>
struct CacheView {
  const Elem* keys;
  const Elem* values;
  int64_t block_size;
  int64_t num_kv_heads;
  int64_t head_dim;
};

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BATON_ATTENTION_VECTORS 1
#include <immintrin.h>

// Eight lanes of a cached row: float32 as it is, float16 widened on the way into the register.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The scores of 8 keys, q . k_j with k_j at k + j * step, D a multiple of 8: one accumulator a
// key, then the eight reduced together, so every key's sum is taken in the same order whichever
// lane it is in. With `count` < 8 keys the spare lanes repeat the last key.
template <typename Elem>
inline __m256 scores8(const float* q, const Elem* k, int64_t step, int64_t count, int64_t D) {
  const int64_t last = count - 1;
  const Elem* k0 = k;
  const Elem* k1 = k + std::min<int64_t>(1, last) * step;
  const Elem* k2 = k + std::min<int64_t>(2, last) * step;
  const Elem* k3 = k + std::min<int64_t>(3, last) * step;
  const Elem* k4 = k + std::min<int64_t>(4, last) * step;
  const Elem* k5 = k + std::min<int64_t>(5, last) * step;
  const Elem* k6 = k + std::min<int64_t>(6, last) * step;
  const Elem* k7 = k + std::min<int64_t>(7, last) * step;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 qd = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qd, load8(k0 + d), a0);
    a1 = _mm256_fmadd_ps(qd, load8(k1 + d), a1);
    a2 = _mm256_fmadd_ps(qd, load8(k2 + d), a2);
    a3 = _mm256_fmadd_ps(qd, load8(k3 + d), a3);
    a4 = _mm256_fmadd_ps(qd, load8(k4 + d), a4);
    a5 = _mm256_fmadd_ps(qd, load8(k5 + d), a5);
    a6 = _mm256_fmadd_ps(qd, load8(k6 + d), a6);
    a7 = _mm256_fmadd_ps(qd, load8(k7 + d), a7);
  }
  const __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  // Lanes 0-3 of s0123 are keys 0-3 over the low half of each vector, lanes 4-7 the high half.
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                       _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

// A cached row as float32 for the plain loops: the row itself, or a float16 row widened into
// `buffer` (D floats). Both dtypes then run the same float loop over the same values, so a
// float16 cache's result stays the float32 kernel's over the widened cache, bit for bit,
// whatever the compiler makes of each loop.
inline const float* as_float(const float* row, int64_t, float*) { return row; }
inline const float* as_float(const c10::Half* row, int64_t D, float* buffer) {
  baton::widen_half(row, buffer, D);
  return buffer;
}

// s[t] = q . k_t for the block's n keys, k_t at k + t * step; `buffer` holds D floats.
template <typename Elem>
void block_scores(const float* q, const Elem* k, int64_t step, int64_t n, int64_t D, float* s,
                  float* buffer) {
#ifdef BATON_ATTENTION_VECTORS
  if (D % 8 == 0) {
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) _mm256_storeu_ps(s + t, scores8(q, k + t * step, step, 8, D));
    if (t < n) {
      const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - t)), lanes);
      _mm256_maskstore_ps(s + t, keep, scores8(q, k + t * step, step, n - t, D));
    }
    return;
  }
#endif
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = as_float(k + t * step, D, buffer);
    float dot = 0.0f;
    for (int64_t d = 0; d < D; ++d) dot += q[d] * kt[d];
    s[t] = dot;
  }
}

// a[d] += sum over the block's n keys of p[t] * v_t[d], v_t at v + t * step, t in order;
// `buffer` holds D floats.
template <typename Elem>
void accumulate_values(const float* p, const Elem* v, int64_t step, int64_t n, int64_t D,
                       float* a, float* buffer) {
  int64_t d0 = 0;
#ifdef BATON_ATTENTION_VECTORS
  // 64 columns at a time in eight registers, then 8 at a time.
  for (; d0 + 64 <= D; d0 += 64) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_loadu_ps(a + d0 + 8 * i);
    for (int64_t t = 0; t < n; ++t) {
      const __m256 pt = _mm256_set1_ps(p[t]);
      const Elem* vt = v + t * step + d0;
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(pt, load8(vt + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(a + d0 + 8 * i, acc[i]);
  }
  for (; d0 + 8 <= D; d0 += 8) {
    __m256 acc = _mm256_loadu_ps(a + d0);
    for (int64_t t = 0; t < n; ++t) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8(v + t * step + d0), acc);
    }
    _mm256_storeu_ps(a + d0, acc);
  }
#endif
  if (d0 == D) return;
  for (int64_t t = 0; t < n; ++t) {
    const float* vt = as_float(v + t * step, D, buffer);
    for (int64_t d = d0; d < D; ++d) a[d] += p[t] * vt[d];
  }
}

// A float16 cache's keys and values of one KV head in a block, its first n rows, widened once
// into `keys` and `values` (n * D floats each, rows D apart) for a tile of several rows to read
// from L1: widened once a block, not once per query head and row. Widening is exact, so the
// arithmetic on them is the float32 cache's on the same values, bit for bit. A row alone (a
// decode) widens each value as it loads it: there, widening first and reading back is slower.
inline void widen_head(const c10::Half* k, const c10::Half* v, int64_t stride, int64_t n,
                       int64_t D, float* keys, float* values) {
  for (int64_t t = 0; t < n; ++t) {
    baton::widen_half(k + t * stride, keys + t * D, D);
    baton::widen_half(v + t * stride, values + t * D, D);
  }
}

// Asks for the next block's keys and values while this block is worked on, a few cache lines
// at a time between the passes over it. Blocks lie wherever the table puts them, so the
// hardware prefetcher, which follows addresses, cannot start on the next block before its loads
// do. All of a block asked for at once would stall the loads of the block being read behind
// the prefetches that cannot yet be served; spread out, the requests keep ahead of the reads
// without holding them up.
// Keys and values go in step, token by token, each token's row of the task's heads front to back.
struct NextBlock {
  const char* keys = nullptr;
  const char* values = nullptr;
  int64_t token_stride = 0;  // bytes from one token's row to the next's
  int64_t row_bytes = 0;     // bytes of the task's heads in a token's row
  int64_t offset = 0;        // the next line to ask for, in the current token's row
  int64_t tokens_left = 0;
  int64_t lines_per_pass = 0;

  // The rows of `tokens` tokens from `keys` and `values`, over `passes` calls of `some`.
  NextBlock(const char* keys, const char* values, int64_t token_stride, int64_t row_bytes,
            int64_t tokens, int64_t passes)
      : keys(keys), values(values), token_stride(token_stride), row_bytes(row_bytes),
        tokens_left(tokens) {
    const int64_t lines = tokens * ((row_bytes + 63) / 64);
    lines_per_pass = (lines + passes - 1) / std::max<int64_t>(1, passes);
  }
  NextBlock() = default;

  // The next share of the lines.
  void some() {
    for (int64_t i = 0; i < lines_per_pass && tokens_left > 0; ++i) {
      __builtin_prefetch(keys + offset);
      __builtin_prefetch(values + offset);
      offset += 64;
      if (offset >= row_bytes) {
        offset = 0;
        keys += token_stride;
        values += token_stride;
        --tokens_left;
      }
    }
  }
};

// The online softmax of one query row: its running maximum, sum and weighted values.
struct RowState {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
};

// A query row of a tile: its causal length (it attends to the first `len` tokens, the last
// `window` of them with a window), its q row and its out row.
struct TileRow {
  int64_t len;
  const float* q;
  float* out;
};

// The rows of a tile, KV heads [first_head, end_head): each head's `group` query heads at
// q + head * group * D, results to out at the same offsets. Block by block, every head of the
// block in turn, so each block is read once, front to back; each row takes the keys it attends
// to from the block with the same arithmetic, in the same order, as it would alone. `sinks`
// holds a logit per query head, or is null.
template <typename Index, typename Elem>
void attend_tile(const CacheView<Elem>& cache, const Index* table, const TileRow* rows,
                 int64_t count, int64_t group, int64_t first_head, int64_t end_head, float scale,
                 int64_t window, float softcap, const float* sinks) {
  const int64_t D = cache.head_dim;
  const int64_t bs = cache.block_size;
  const int64_t stride = cache.num_kv_heads * D;  // from one token to the next in a block
  const int64_t heads_per_row = (end_head - first_head) * group;
  std::vector<float> acc(count * heads_per_row * D, 0.0f);
  std::vector<RowState> state(count * heads_per_row);
  // A block's scores, one cached row widened (the plain loops' `buffer`), and, for a float16
  // cache's tile of several rows, one head's keys and values of a block widened: one
  // allocation a task.
  const bool widens = std::is_same_v<Elem, c10::Half> && count > 1;
  std::vector<float> scratch(bs + D + (widens ? 2 * bs * D : 0));
  float* const scores = scratch.data();
  float* const buffer = scores + bs;
  float* const widened_keys = buffer + D;
  float* const widened_values = widens ? widened_keys + bs * D : nullptr;

  const auto first_key_of = [&](const TileRow& row) {
    return window > 0 ? std::max<int64_t>(0, row.len - window) : 0;
  };
  int64_t earliest = first_key_of(rows[0]), longest = rows[0].len;
  for (int64_t r = 1; r < count; ++r) {
    earliest = std::min(earliest, first_key_of(rows[r]));
    longest = std::max(longest, rows[r].len);
  }
  const auto bytes = [](const Elem* p) { return reinterpret_cast<const char*>(p); };
  for (int64_t first = earliest / bs * bs; first < longest; first += bs) {
    const int64_t block = static_cast<int64_t>(table[first / bs]);
    const int64_t block_len = std::min(bs, longest - first);  // tokens some row reads here
    // The rows that read this block: a shorter row may end before it, a window start after it.
    int64_t readers = 0;
    for (int64_t r = 0; r < count; ++r) {
      readers += first < rows[r].len && first + bs > first_key_of(rows[r]);
    }
    // The next block's lines, spread over every call of `some` this block makes: four for each
    // reading row and query head.
    NextBlock next;
    if (first + bs < longest) {
      const Elem* next_block =
          cache.keys + static_cast<int64_t>(table[first / bs + 1]) * bs * stride;
      next = NextBlock(bytes(next_block + first_head * D),
                       bytes(next_block + (cache.values - cache.keys) + first_head * D),
                       stride * static_cast<int64_t>(sizeof(Elem)),
                       (end_head - first_head) * D * static_cast<int64_t>(sizeof(Elem)),
                       std::min(bs, longest - first - bs), 4 * readers * heads_per_row);
    }
    for (int64_t head = first_head; head < end_head; ++head) {
      // Every row of the tile over this head's keys and values in the block, rows `step`
      // elements apart: the cache's own (float32 or float16) or widened ones (float32).
      const auto attend_rows = [&](const auto* keys, const auto* values, int64_t step) {
        for (int64_t r = 0; r < count; ++r) {
          const TileRow& tile_row = rows[r];
          const int64_t first_key = first_key_of(tile_row);
          if (first >= tile_row.len || first + bs <= first_key) continue;
          // Keys before the window's first in this block are skipped: the row reads from there.
          const int64_t skip = std::max<int64_t>(0, first_key - first);
          const int64_t n = std::min(bs, tile_row.len - first) - skip;
          const auto* k = keys + skip * step;
          const auto* v = values + skip * step;
          for (int64_t g = 0; g < group; ++g) {
            const int64_t row = r * heads_per_row + (head - first_head) * group + g;
            const float* qr = tile_row.q + (head * group + g) * D;
            next.some();
            block_scores(qr, k, step, n, D, scores, buffer);
            next.some();
            float block_max = -std::numeric_limits<float>::infinity();
            for (int64_t t = 0; t < n; ++t) {
              scores[t] *= scale;
              if (softcap > 0.0f) scores[t] = softcap * std::tanh(scores[t] / softcap);
              block_max = std::max(block_max, scores[t]);
            }
            // Rescale what is accumulated when this block raises the maximum.
            RowState& st = state[row];
            const float new_max = std::max(st.max, block_max);
            const float correction = baton::exp_nonpositive(st.max - new_max);
            float* a = acc.data() + row * D;
            if (correction != 1.0f) {
              for (int64_t d = 0; d < D; ++d) a[d] *= correction;
              st.sum *= correction;
            }
            st.max = new_max;
            float block_sum = 0.0f;
            for (int64_t t = 0; t < n; ++t) {
              scores[t] = baton::exp_nonpositive(scores[t] - new_max);
              block_sum += scores[t];
            }
            st.sum += block_sum;
            next.some();
            accumulate_values(scores, v, step, n, D, a, buffer);
            next.some();
          }
        }
      };
      const int64_t offset = block * bs * stride + head * D;
      if constexpr (std::is_same_v<Elem, c10::Half>) {
        if (widens) {
          widen_head(cache.keys + offset, cache.values + offset, stride, block_len, D,
                     widened_keys, widened_values);
          attend_rows(widened_keys, widened_values, D);
          continue;
        }
      }
      attend_rows(cache.keys + offset, cache.values + offset, stride);
    }
  }
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t j = 0; j < heads_per_row; ++j) {
      const int64_t row = r * heads_per_row + j;
      float inverse = 1.0f / state[row].sum;
      if (sinks != nullptr) {
        // The sink as one more score: both terms rescaled to the larger maximum, so neither
        // exponent is positive.
        const float sink = sinks[first_head * group + j];
        const float top = std::max(state[row].max, sink);
        const float kept = baton::exp_nonpositive(state[row].max - top);
        inverse = kept / (state[row].sum * kept + baton::exp_nonpositive(sink - top));
      }
      float* o = rows[r].out + (first_head * group + j) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = acc[row * D + d] * inverse;
    }
  }
}

// Every block id a row will read is inside the cache. Only the blocks the longest of its
// sequence's rows covers (`reach`, per table row): a table's padding beyond them is never read.
// A loop over raw ids, not tensor reductions: this runs once per layer, and at a decode step
// the reductions' calls cost more than the attention.
template <typename Index>
void check_block_ids(const at::Tensor& block_tables, const std::vector<int64_t>& reach,
                     int64_t num_blocks, int64_t block_size) {
  const Index* tables = block_tables.data_ptr<Index>();
  const int64_t width = block_tables.size(1);
  for (size_t seq = 0; seq < reach.size(); ++seq) {
    const Index* table = tables + seq * width;
    const int64_t used = (reach[seq] + block_size - 1) / block_size;
    for (int64_t j = 0; j < used; ++j) {
      TORCH_CHECK(table[j] >= 0 && table[j] < num_blocks, "a block id is outside the cache");
    }
  }
}

template <typename Index, typename Elem>
void run(const at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
         const at::Tensor& block_tables, const int64_t* lens, const at::Tensor& rows,
         const at::Tensor& seqs, double scale, int64_t window, double softcap,
         const float* sinks) {
  const int64_t num_blocks = kv_cache.size(1);
  const int64_t num_heads = q.size(1);
  CacheView<Elem> cache{kv_cache.data_ptr<Elem>(), nullptr, kv_cache.size(2), kv_cache.size(3),
                        kv_cache.size(4)};
  cache.values = cache.keys + num_blocks * cache.block_size * cache.num_kv_heads * cache.head_dim;
  const int64_t group = num_heads / cache.num_kv_heads;
  const Index* tables = block_tables.data_ptr<Index>();
  const int64_t width = block_tables.size(1);
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  const int64_t* seq_ids = seqs.data_ptr<int64_t>();
  const float* q_data = q.data_ptr<float>();
  float* out_data = out.data_ptr<float>();
  const int64_t q_row_stride = q.stride(0);
  const int64_t out_row_stride = out.stride(0);
  // Tiles: runs of up to tuning::kAttentionTileRows consecutive rows of one sequence, which
  // share every block's keys and values (widened once, then read from L1 by each row); a decode
  // row is a tile of one. `tile_start` holds each tile's first row, then the end.
  const int64_t num_rows = rows.numel();
  std::vector<TileRow> tile_rows(num_rows);
  std::vector<int64_t> tile_start;
  for (int64_t i = 0; i < num_rows; ++i) {
    tile_rows[i] = {lens[i], q_data + row_ids[i] * q_row_stride,
                    out_data + row_ids[i] * out_row_stride};
    if (i == 0 || seq_ids[i] != seq_ids[i - 1] ||
        i - tile_start.back() == tuning::kAttentionTileRows) {
      tile_start.push_back(i);
    }
  }
  const int64_t num_tiles = static_cast<int64_t>(tile_start.size());
  tile_start.push_back(num_rows);
  // A task is a tile's heads, or one head of it when there are too few tiles to keep every
  // thread busy (under tuning::kAttentionTilesPerThread a thread), handed to the threads one at
  // a time (tiles differ in length). Each head's result is computed the same way either way.
  const int64_t heads_per_task =
      num_tiles >= tuning::kAttentionTilesPerThread * at::get_num_threads() ? cache.num_kv_heads
                                                                             : 1;
  const int64_t tasks_per_tile = cache.num_kv_heads / heads_per_task;

  baton::parallel_shares(num_tiles * tasks_per_tile, 1, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task / tasks_per_tile;
      const int64_t first_head = (task % tasks_per_tile) * heads_per_task;
      const int64_t i = tile_start[tile];
      attend_tile<Index, Elem>(cache, tables + seq_ids[i] * width, tile_rows.data() + i,
                               tile_start[tile + 1] - i, group, first_head,
                               first_head + heads_per_task, static_cast<float>(scale), window,
                               static_cast<float>(softcap), sinks);
    }
  });
}

void paged_attention(const at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
                  const at::Tensor& block_tables, const at::Tensor& lens, const at::Tensor& rows,
                  const at::Tensor& seqs, double scale, int64_t window, double softcap,
                  const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(window >= 0 && softcap >= 0.0, "window and softcap are >= 0 (0: none)");
  TORCH_CHECK(!sinks.has_value() ||
                  (sinks->scalar_type() == at::kFloat && sinks->device().is_cpu() &&
                   sinks->is_contiguous() && sinks->dim() == 1 && sinks->size(0) == q.size(1)),
              "sinks are a contiguous float32 CPU tensor [Hq], one logit per query head");
  const float* sink_data = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  TORCH_CHECK(q.device().is_cpu() && kv_cache.device().is_cpu(), "CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "q and out are float32");
  TORCH_CHECK(kv_cache.scalar_type() == at::kFloat || kv_cache.scalar_type() == at::kHalf,
              "the KV cache is float32 or float16");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "q and out are [T, Hq, D]");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2), "q rows must be contiguous");
  TORCH_CHECK(out.stride(2) == 1 && out.stride(1) == out.size(2), "out rows must be contiguous");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache is a contiguous [2, num_blocks, block_size, Hkv, D]");
  TORCH_CHECK(kv_cache.size(4) == q.size(2), "q and the cache disagree on head_dim");
  TORCH_CHECK(q.size(1) % kv_cache.size(3) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.is_contiguous(),
              "block_tables is a contiguous [num_seqs, width]");
  TORCH_CHECK(rows.scalar_type() == at::kLong && seqs.scalar_type() == at::kLong &&
                  rows.is_contiguous() && seqs.is_contiguous() && rows.numel() == seqs.numel() &&
                  lens.numel() == rows.numel(),
              "rows and seqs are int64 of one length, and lens has one length a row");
  // Checked once here so the tasks can trust every index they read.
  const auto row_lens = lens.to(at::kLong).contiguous();
  const int64_t* len_data = row_lens.data_ptr<int64_t>();
  const int64_t capacity = block_tables.size(1) * kv_cache.size(2);
  const int64_t* seq_ids = seqs.data_ptr<int64_t>();
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  std::vector<int64_t> reach(block_tables.size(0), 0);
  for (int64_t i = 0; i < rows.numel(); ++i) {
    TORCH_CHECK(len_data[i] >= 1 && len_data[i] <= capacity,
                "a row's length is below 1 or past its block table");
    TORCH_CHECK(seq_ids[i] >= 0 && seq_ids[i] < block_tables.size(0),
                "a row names no sequence of the block tables");
    TORCH_CHECK(row_ids[i] >= 0 && row_ids[i] < q.size(0), "a row is not a row of q");
    reach[seq_ids[i]] = std::max(reach[seq_ids[i]], len_data[i]);
  }
  const bool half = kv_cache.scalar_type() == at::kHalf;
  if (block_tables.scalar_type() == at::kInt) {
    check_block_ids<int32_t>(block_tables, reach, kv_cache.size(1), kv_cache.size(2));
    (half ? run<int32_t, c10::Half> : run<int32_t, float>)(
        out, q, kv_cache, block_tables, len_data, rows, seqs, scale, window, softcap, sink_data);
  } else {
    TORCH_CHECK(block_tables.scalar_type() == at::kLong, "block_tables are int32 or int64");
    check_block_ids<int64_t>(block_tables, reach, kv_cache.size(1), kv_cache.size(2));
    (half ? run<int64_t, c10::Half> : run<int64_t, float>)(
        out, q, kv_cache, block_tables, len_data, rows, seqs, scale, window, softcap, sink_data);
  }
}

}  // namespace

TORCH_LIBRARY(baton_cpu, m) {
  m.def(
      "paged_attention(Tensor(a!) out, Tensor q, Tensor kv_cache, Tensor block_tables, "
      "Tensor lens, Tensor rows, Tensor seqs, float scale, int window=0, "
      "float softcap=0.0, Tensor? sinks=None) -> ()");
}

TORCH_LIBRARY_IMPL(baton_cpu, CPU, m) { m.impl("paged_attention", &paged_attention); }
