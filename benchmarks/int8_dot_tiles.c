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
// Prints G multiply-adds a second for each, with a checksum of the sums so none is optimized
// away. The products are not checked against each other: the inputs differ by path (int16
// against int8 activations); only the pace is measured.

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
  for (int r = 0; r < ROWS; ++r)
    s += _mm256_extract_epi32(acc[r][0], 1) + _mm256_extract_epi32(acc[r][1], 2);
  return s;
}

static void report(const char* name, double seconds, int sink) {
  const double macs = (double)REPEATS * K * ROWS * 2;
  printf("%-28s %6.1f G multiply-adds/s (%d)\n", name, macs / seconds / 1e9, sink);
}

// The weight vector of channel c at k: 16 codes widened to int16, or 32 codes as bytes.
static inline __m256i widened(int c, int k) {
  return _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)&weights[c][k]));
}
static inline __m256i bytes(int c, int k) {
  return _mm256_load_si256((const __m256i*)&weights[c][k]);
}

// A row's activations at k: int16 or int8.
static inline __m256i x16_at(int r, int k) { return _mm256_load_si256((const __m256i*)&x16[r][k]); }
static inline __m256i x8_at(int r, int k) { return _mm256_load_si256((const __m256i*)&x8[r][k]); }

// One row's step of each path: acc plus the row's activations x times the weight vector w.
static inline __m256i int16_step(__m256i acc, __m256i w, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
}
static inline __m256i sign_trick_step(__m256i acc, __m256i w, __m256i x) {
  const __m256i products = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}
static inline __m256i unsigned_step(__m256i acc, __m256i w, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), _mm256_set1_epi16(1)));
}
static inline __m256i maddubs_only_step(__m256i acc, __m256i w, __m256i x) {
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(x, w));
}

// Times one path over the tile: k in steps of STEP, both channels' weights loaded by LOAD_W once
// a step and each row's activations by LOAD_X once, used for both channels by ROW_STEP. A macro,
// not a function taking pointers, so every path compiles to its own inlined loop.
#define TIME_TILE(NAME, STEP, LOAD_W, LOAD_X, ROW_STEP)        \
  do {                                                         \
    int sink = 0;                                              \
    const double start = now();                                \
    for (long it = 0; it < REPEATS; ++it) {                    \
      __m256i acc[ROWS][2] = {{_mm256_setzero_si256()}};       \
      for (int k = 0; k < K; k += (STEP)) {                    \
        const __m256i wa = LOAD_W(0, k), wb = LOAD_W(1, k);    \
        for (int r = 0; r < ROWS; ++r) {                       \
          const __m256i xv = LOAD_X(r, k);                     \
          acc[r][0] = ROW_STEP(acc[r][0], wa, xv);             \
          acc[r][1] = ROW_STEP(acc[r][1], wb, xv);             \
        }                                                      \
      }                                                        \
      sink += lanes_sum(acc);                                  \
    }                                                          \
    report(NAME, now() - start, sink);                         \
  } while (0)

int main(void) {
  for (int c = 0; c < 2; ++c)
    for (int k = 0; k < K; ++k) weights[c][k] = (int8_t)((k * 7 + c) % 255 - 127);
  for (int r = 0; r < ROWS; ++r)
    for (int k = 0; k < K; ++k) {
      x16[r][k] = (int16_t)((k * 13 + r) % 30000 - 15000);
      x8[r][k] = (int8_t)((k * 5 + r) % 255 - 127);
    }
  TIME_TILE("int16 (Baton's)", 16, widened, x16_at, int16_step);
  TIME_TILE("int8, sign trick (Q8_0's)", 32, bytes, x8_at, sign_trick_step);
  TIME_TILE("u8 x s8, 7-bit activations", 32, bytes, x8_at, unsigned_step);
  TIME_TILE("maddubs only (overflows)", 32, bytes, x8_at, maddubs_only_step);
  return 0;
}
