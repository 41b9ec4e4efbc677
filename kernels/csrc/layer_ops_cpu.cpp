// The small per-layer operations of a decoder layer on the CPU, float32: RMSNorm (alone and with
// the residual add), the gated activations, and rotary positions with the KV-cache write.
//
// At a decode step each of these touches a few kilobytes, so in plain torch their cost is the
// calls, not the arithmetic: RMSNorm is eight tensor ops, rotary with its cache write about
// twenty. Here each is one call. Every row is computed on its own, in the same order whatever the
// batch, so a row's bits do not depend on the rest of the batch (tests/test_batch_invariance.py).
//
// Layouts as in the references (kernels/rms_norm.py, kernels/activation.py, kernels/rotary.py,
// kernels/kv_cache.py): x [T, H]; qkv [T, (Hq + 2 Hkv) D] with q, k, v side by side;
// cos_sin [positions, D] with cos in the first half and sin in the second; kv_cache [2,
// num_blocks, block_size, Hkv, D], float32 or float16 (keys and values are rounded to it as
// they are stored); slot_mapping [T], negative for tokens not stored.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fast_exp.h"
#include "gates.h"
#include "half_convert.h"
#include "parallel_shares.h"
#include "tuning.h"

namespace baton {

namespace {

template <typename Act>
void act_and_mul_rows(Act act, const float* x, int64_t ldx, int64_t up, float* out, int64_t ldo,
                      int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = x + r * ldx;
    for (int64_t i = 0; i < width; ++i) out[r * ldo + i] = act(gate[i]) * gate[up + i];
  }
}

}  // namespace

void gate_rows(Gate gate, const float* x, int64_t ldx, int64_t up, float* out, int64_t ldo,
               int64_t rows, int64_t width) {
  if (gate == Gate::kSilu) {
    act_and_mul_rows([](float g) { return silu(g); }, x, ldx, up, out, ldo, rows, width);
  } else {
    act_and_mul_rows([](float g) { return gelu_tanh(g); }, x, ldx, up, out, ldo, rows, width);
  }
}

}  // namespace baton

namespace {

// Rows per parallel task: a decode step's few rows stay on one thread (a fork costs more than
// they do); a prefill chunk's hundreds are split.
constexpr int64_t kRowGrain = baton::tuning::kLayerOpRowGrain;

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, name, " is float32 on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, name, " is [rows, columns], contiguous rows");
}

inline void normalize_row(const float* x, const float* weight, int64_t n, float eps, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "weight is [columns]");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  const int64_t n = x.size(1), ldx = x.stride(0);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  baton::parallel_rows(x.size(0), kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      normalize_row(xp + r * ldx, wp, n, static_cast<float>(eps), op + r * n);
    }
  });
  return out;
}

// (normed, x + residual): the add in float32, as the reference adds in the model's dtype.
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x,
                                                      const at::Tensor& residual,
                                                      const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual have one shape");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "weight is [columns]");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  auto sum = at::empty({x.size(0), x.size(1)}, x.options());
  const int64_t n = x.size(1), ldx = x.stride(0), ldr = residual.stride(0);
  const float *xp = x.data_ptr<float>(), *rp = residual.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float *op = out.data_ptr<float>(), *sp = sum.data_ptr<float>();
  baton::parallel_rows(x.size(0), kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* s = sp + r * n;
      for (int64_t i = 0; i < n; ++i) s[i] = xp[r * ldx + i] + rp[r * ldr + i];
      normalize_row(s, wp, n, static_cast<float>(eps), op + r * n);
    }
  });
  return {out, sum};
}

// [gate | up] -> act(gate) * up, row by row.
at::Tensor gated(const at::Tensor& x, baton::Gate gate) {
  check_rows(x, "x");
  TORCH_CHECK(x.size(1) % 2 == 0, "x holds [gate | up]: an even number of columns");
  const int64_t half = x.size(1) / 2, ldx = x.stride(0);
  auto out = at::empty({x.size(0), half}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  baton::parallel_rows(x.size(0), kRowGrain, [&](int64_t begin, int64_t end) {
    baton::gate_rows(gate, xp + begin * ldx, ldx, half, op + begin * half, half, end - begin,
                     half);
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& x) { return gated(x, baton::Gate::kSilu); }

at::Tensor gelu_tanh_and_mul(const at::Tensor& x) { return gated(x, baton::Gate::kGeluTanh); }

// Rotate-half: dim i pairs with dim i + D/2.
inline void rotate(const float* x, const float* cos, const float* sin, int64_t half, float* out) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    out[i] = x1 * cos[i] - x2 * sin[i];
    out[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

// Rotates token t's queries into q and its keys, with its values, into its cache slot.
template <typename Elem>
void rotate_and_store(const at::Tensor& qkv, const int64_t* pp, const at::Tensor& cos_sin,
                      at::Tensor& kv_cache, const int64_t* sp, int64_t num_heads,
                      int64_t num_kv_heads, at::Tensor& q) {
  const int64_t D = cos_sin.size(1), half = D / 2, T = qkv.size(0);
  const int64_t num_slots = kv_cache.size(1) * kv_cache.size(2), row = num_kv_heads * D;
  const float *src = qkv.data_ptr<float>(), *table = cos_sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  Elem* keys = kv_cache.data_ptr<Elem>();
  Elem* values = keys + num_slots * row;
  const int64_t ld = qkv.stride(0);
  baton::parallel_rows(T, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> rotated(std::is_same_v<Elem, float> ? 0 : D);
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = table + pp[t] * D;
      const float* sin = cos + half;
      const float* token = src + t * ld;
      for (int64_t h = 0; h < num_heads; ++h) rotate(token + h * D, cos, sin, half, qp + (t * num_heads + h) * D);
      if (sp[t] < 0) continue;
      const float* k = token + num_heads * D;
      Elem* key_slot = keys + sp[t] * row;
      if constexpr (std::is_same_v<Elem, float>) {
        for (int64_t h = 0; h < num_kv_heads; ++h) rotate(k + h * D, cos, sin, half, key_slot + h * D);
        std::memcpy(values + sp[t] * row, k + row, row * sizeof(float));
      } else {
        for (int64_t h = 0; h < num_kv_heads; ++h) {
          rotate(k + h * D, cos, sin, half, rotated.data());
          baton::narrow_to_half(rotated.data(), key_slot + h * D, D);
        }
        baton::narrow_to_half(k + row, values + sp[t] * row, row);
      }
    }
  });
}

// The rotated queries [T, Hq, D]; rotated keys and the values go straight to their cache slots.
at::Tensor rotary_and_cache_kv(const at::Tensor& qkv, const at::Tensor& positions,
                               const at::Tensor& cos_sin, at::Tensor& kv_cache,
                               const at::Tensor& slot_mapping, int64_t num_heads,
                               int64_t num_kv_heads) {
  check_rows(qkv, "qkv");
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.is_contiguous() && cos_sin.dim() == 2,
              "cos_sin is a contiguous float32 [positions, head_dim]");
  const int64_t D = cos_sin.size(1), T = qkv.size(0);
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * num_kv_heads) * D, "qkv is [T, (Hq + 2 Hkv) D]");
  TORCH_CHECK((kv_cache.scalar_type() == at::kFloat || kv_cache.scalar_type() == at::kHalf) &&
                  kv_cache.is_contiguous() && kv_cache.dim() == 5 && kv_cache.size(0) == 2 &&
                  kv_cache.size(3) == num_kv_heads && kv_cache.size(4) == D,
              "kv_cache is a contiguous float32 or float16 [2, blocks, block_size, Hkv, D]");
  const auto pos = positions.to(at::kLong).contiguous();
  const auto slots = slot_mapping.to(at::kLong).contiguous();
  TORCH_CHECK(pos.numel() == T && slots.numel() == T, "one position and one slot per token");
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t num_slots = kv_cache.size(1) * kv_cache.size(2);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pp[t] >= 0 && pp[t] < cos_sin.size(0), "a position is outside the rotary cache");
    TORCH_CHECK(sp[t] < num_slots, "a slot is outside the KV cache");
  }
  auto q = at::empty({T, num_heads, D}, qkv.options());
  if (kv_cache.scalar_type() == at::kHalf) {
    rotate_and_store<c10::Half>(qkv, pp, cos_sin, kv_cache, sp, num_heads, num_kv_heads, q);
  } else {
    rotate_and_store<float>(qkv, pp, cos_sin, kv_cache, sp, num_heads, num_kv_heads, q);
  }
  return q;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(baton_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("gelu_tanh_and_mul(Tensor x) -> Tensor");
  m.def(
      "rotary_and_cache_kv(Tensor qkv, Tensor positions, Tensor cos_sin, Tensor(a!) kv_cache, "
      "Tensor slot_mapping, int num_heads, int num_kv_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(baton_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("gelu_tanh_and_mul", &gelu_tanh_and_mul);
  m.impl("rotary_and_cache_kv", &rotary_and_cache_kv);
}
