// float16 <-> float32 for a KV cache kept in float16 on the CPU: F16C's eight-lane conversions
// where the build has them, c10's otherwise. Both round to nearest even, as torch's
// `.to(torch.float16)` does, so a cache written here or from Python holds the same bits.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace baton {

inline void widen_half(const c10::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void narrow_to_half(const float* src, c10::Half* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = c10::Half(src[i]);
}

}  // namespace baton
