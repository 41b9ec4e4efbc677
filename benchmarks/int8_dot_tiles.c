// Which integer dot product an AVX2 CPU without VNNI runs fastest, in the tile shape Baton's int8
// kernel uses (4 rows x 2 output channels, weights loaded once per k block and used for every
// row), on L1-resident data, one thread:
//   - int16: int8 weights widened to int16 (`vpmovsxbw`), activations rounded to int16, `vpmaddwd`
//     then `vpaddd` (what kernels/csrc/int8_linear_cpu.cpp does);
//   - int8, sign trick: activations rounded to int8, |x| times sign(w, x) by `vpmaddubsw`, then
//     `vpmaddwd` by ones and `vpaddd` (llama.cpp's Q8_0 dot on AVX2);
//   - u8 x s8: activations offset to 7-bit unsigned, `vpmaddubsw`, `vpmaddwd` by ones, `vpaddd`
//     (no sign step, a coarser activation);
//   - maddubs only: int16 accumulation without widening, which overflows on real data; the
//     ceiling of any byte path.
//
//     gcc -O3 -march=native benchmarks/int8_dot_tiles.c -o /tmp/int8_dot_tiles && /tmp/int8_dot_tiles
//
// Prints G multiply-adds a second for each. The products are not checked against each other:
// the inputs differ by path (int16 against int8 activations); only the pace is measured.

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define K 2048
#define ROWS 4
#define REPEATS 400000

static int8_t weights[2][K] __attribute__((aligned(64)));
static int16_t x16[ROWS][K] __attribute__((aligned(64)));
static int8_t x8[ROWS][K] __attribute__((aligned(64)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int lanes_sum(__m256i acc[ROWS][2]) {
  int s = 0;
  for (int r = 0; r < ROWS; ++r) s += _mm256_extract_epi32(acc[r][0], 1) + _mm256_extract_epi32(acc[r][1], 2);
  return s;
}

static void report(const char* name, double seconds, int sink) {
  const double macs = (double)REPEATS * K * ROWS * 2;
  printf("%-28s %6.1f G multiply-adds/s (%d)\n", name, macs / seconds / 1e9, sink);
}

int main(void) {
  for (int c = 0; c < 2; ++c)
    for (int k = 0; k < K; ++k) weights[c][k] = (int8_t)((k * 7 + c) % 255 - 127);
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < K; ++k) {
      x16[r][k] = (int16_t)((k * 13 + r) % 30000 - 15000);
      x8[r][k] = (int8_t)((k * 5 + r) % 255 - 127);
    }
  const __m256i ones = _mm256_set1_epi16(1);
  int sink = 0;

  double start = now();
  for (long it = 0; it < REPEATS; ++it) {
    __m256i acc[ROWS][2] = {{_mm256_setzero_si256()}};
    for (int k = 0; k < K; k += 16) {
      const __m256i wa = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)&weights[0][k]));
      const __m256i wb = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)&weights[1][k]));
      for (int r = 0; r < ROWS; ++r) {
        const __m256i xv = _mm256_load_si256((const __m256i*)&x16[r][k]);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(wa, xv));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(wb, xv));
      }
    }
    sink += lanes_sum(acc);
  }
  report("int16 (Baton's)", now() - start, sink);

  start = now();
  for (long it = 0; it < REPEATS; ++it) {
    __m256i acc[ROWS][2] = {{_mm256_setzero_si256()}};
    for (int k = 0; k < K; k += 32) {
      const __m256i wa = _mm256_load_si256((const __m256i*)&weights[0][k]);
      const __m256i wb = _mm256_load_si256((const __m256i*)&weights[1][k]);
      for (int r = 0; r < ROWS; ++r) {
        const __m256i xv = _mm256_load_si256((const __m256i*)&x8[r][k]);
        const __m256i ax = _mm256_sign_epi8(xv, xv);
        acc[r][0] = _mm256_add_epi32(
            acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wa, xv)), ones));
        acc[r][1] = _mm256_add_epi32(
            acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wb, xv)), ones));
      }
    }
    sink += lanes_sum(acc);
  }
  report("int8, sign trick (Q8_0's)", now() - start, sink);

  start = now();
  for (long it = 0; it < REPEATS; ++it) {
    __m256i acc[ROWS][2] = {{_mm256_setzero_si256()}};
    for (int k = 0; k < K; k += 32) {
      const __m256i wa = _mm256_load_si256((const __m256i*)&weights[0][k]);
      const __m256i wb = _mm256_load_si256((const __m256i*)&weights[1][k]);
      for (int r = 0; r < ROWS; ++r) {
        const __m256i xv = _mm256_load_si256((const __m256i*)&x8[r][k]);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(xv, wa), ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(xv, wb), ones));
      }
    }
    sink += lanes_sum(acc);
  }
  report("u8 x s8, 7-bit activations", now() - start, sink);

  start = now();
  for (long it = 0; it < REPEATS; ++it) {
    __m256i acc[ROWS][2] = {{_mm256_setzero_si256()}};
    for (int k = 0; k < K; k += 32) {
      const __m256i wa = _mm256_load_si256((const __m256i*)&weights[0][k]);
      const __m256i wb = _mm256_load_si256((const __m256i*)&weights[1][k]);
      for (int r = 0; r < ROWS; ++r) {
        const __m256i xv = _mm256_load_si256((const __m256i*)&x8[r][k]);
        acc[r][0] = _mm256_add_epi16(acc[r][0], _mm256_maddubs_epi16(xv, wa));
        acc[r][1] = _mm256_add_epi16(acc[r][1], _mm256_maddubs_epi16(xv, wb));
      }
    }
    sink += lanes_sum(acc);
  }
  report("maddubs only (overflows)", now() - start, sink);
  return 0;
}
