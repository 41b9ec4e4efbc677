// e^x in plain arithmetic, for loops the compiler should vectorize: a call to expf (or tanhf)
// stops it; and the gates built on it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace baton {

// e^x for x <= 0 (a softmax's exponents, taken after subtracting the maximum; a sigmoid's
// e^-|x|), within a few parts in 1e8: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series
// to r^7, 2^n built in the exponent bits.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // e^-87 is near the smallest normal float; below, 0 is as good
  const float n = std::floor(x * 1.44269504f + 0.5f);
  // ln2 split in two so n * ln2_hi is exact in float (Cody-Waite).
  const float r = (x - n * 0.693145751953125f) - n * 1.42860677e-6f;
  float p = 1.98412698e-4f;
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// 1 / (1 + e^-z) with the exponent kept <= 0: e^z / (1 + e^z) below zero. Past |z| = 87, e^-|z| is
// taken as 0: the sigmoid is 1 above and 0 below.
inline float sigmoid(float z) {
  const float a = -std::fabs(z);
  const float e = a < -87.0f ? 0.0f : exp_nonpositive(a);
  return (z >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// x * sigmoid(x). Far below zero it is -0 and at -inf NaN (-inf * 0), as torch's is.
inline float silu(float x) { return x * sigmoid(x); }

// GeLU with the tanh approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3),
// which is x * sigmoid(2u): for large negative x this keeps the digits that 1 + tanh(u) cancels
// in float.
inline float gelu_tanh(float x) {
  return x * sigmoid(1.5957691216057308f * (x + 0.044715f * x * x * x));  // 2 sqrt(2 / pi)
}

}  // namespace baton
