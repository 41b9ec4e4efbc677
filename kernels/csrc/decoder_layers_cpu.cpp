// A step's decoder layers in one call on the CPU: for a batch of prefill chunks and decodes,
// every layer of a plain pre-norm decoder (Llama's shape: RMSNorm, fused qkv with rotary,
// paged attention, o, RMSNorm, gated MLP) and the final norm, run back to back from C++.
//
// The kernels are Baton's own ops (layer_ops_cpu.cpp, paged_attention_cpu.cpp,
// int8_linear_cpu.cpp, f32_linear_cpu.cpp) and oneDNN's packed linear, called through the
// dispatcher in the same order and with the same arguments as gpu/models/model.py's forward, so the
// result is that forward's, bit for bit. The attention kernel takes every row, each with its own
// causal length, so a prefill chunk's keys are cached (rotary_and_cache_kv) before its rows
// attend. What the one call saves is the Python between the kernels: the module calls, the
// dispatch checks and a Python-to-C++ crossing per op, paid per layer on every step, which at
// one stream cost as much as a small layer's weights take to read; and the GIL, released for the
// whole step.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace {

// Per layer, in this order; a linear is (weight, scales, bias): int8 codes packed for
// baton_cpu::int8_linear when it has scales, else a float weight packed for oneDNN (an MkldnnCPU
// tensor) or for baton_cpu::f32_linear (which also needs the layer's output width). A gate_up
// weight packed for Baton's float32 kernel is in baton_cpu::f32_gated_linear's layout
// (gpu/models/model.py's MLP.pack), which applies the gate itself.
enum Slot : int64_t {
  kInputNorm,
  kQkv,
  kQkvScales,
  kQkvBias,
  kO,
  kOScales,
  kOBias,
  kPostNorm,
  kGateUp,
  kGateUpScales,
  kDown,
  kDownScales,
  kSlotsPerLayer,
};

using OptTensor = std::optional<at::Tensor>;

c10::OperatorHandle find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

at::Tensor linear(const at::Tensor& x, const c10::List<OptTensor>& w, int64_t base,
                  int64_t scales_slot, const OptTensor& bias, int64_t out_features) {
  static const auto int8 =
      find("baton_cpu::int8_linear")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const OptTensor&)>();
  static const auto f32 =
      find("baton_cpu::f32_linear")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t)>();
  // oneDNN's op, called boxed: its string and scalar-list arguments have no stable C++ spelling
  // across torch releases, and one boxed call a linear is noise beside the linear.
  static const auto onednn = find("mkldnn::_linear_pointwise");
  const OptTensor scales = w.get(scales_slot);
  const at::Tensor weight = *w.get(base);
  if (scales.has_value()) return int8.call(x, weight, *scales, bias);
  if (!weight.is_mkldnn()) return f32.call(x, weight, bias, out_features);
  c10::Stack stack{x,      weight, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(),
                   c10::IValue()};
  onednn.callBoxed(&stack);
  return stack[0].toTensor();
}

at::Tensor decoder_layers(const at::Tensor& hidden_in, const at::Tensor& positions,
                         const at::Tensor& cos_sin, at::TensorList kv_caches,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& row_lens, const at::Tensor& rows,
                         const at::Tensor& seqs, const c10::List<OptTensor>& weights,
                         const at::Tensor& final_norm, int64_t num_heads, int64_t num_kv_heads,
                         int64_t intermediate_size, double scale, double eps, bool gelu) {
  static const auto rms_norm =
      find("baton_cpu::rms_norm").typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  static const auto add_norm =
      find("baton_cpu::fused_add_rms_norm")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, double)>();
  static const auto rotary =
      find("baton_cpu::rotary_and_cache_kv")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            at::Tensor&, const at::Tensor&, int64_t, int64_t)>();
  static const auto attend =
      find("baton_cpu::paged_attention")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, double, int64_t, double,
                      const std::optional<at::Tensor>&)>();
  static const auto silu = find("baton_cpu::silu_and_mul").typed<at::Tensor(const at::Tensor&)>();
  static const auto gelu_tanh =
      find("baton_cpu::gelu_tanh_and_mul").typed<at::Tensor(const at::Tensor&)>();
  static const auto gated_f32 =
      find("baton_cpu::f32_gated_linear")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, bool)>();

  const int64_t num_layers = static_cast<int64_t>(kv_caches.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == num_layers * kSlotsPerLayer,
              "weights hold ", static_cast<int64_t>(kSlotsPerLayer), " entries per layer");
  TORCH_CHECK(hidden_in.dim() == 2 && rows.numel() == hidden_in.size(0),
              "the attention kernel serves every row of hidden");
  // paged_attention reads int64 lengths: converted once here rather than in every layer's call.
  const at::Tensor lens = row_lens.to(at::kLong);
  const int64_t num_tokens = hidden_in.size(0), hidden_size = hidden_in.size(1);
  const int64_t head_dim = cos_sin.size(1);
  const int64_t qkv_size = (num_heads + 2 * num_kv_heads) * head_dim;
  at::Tensor hidden = hidden_in, residual;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const int64_t base = layer * kSlotsPerLayer;
    const at::Tensor input_norm = *weights.get(base + kInputNorm);
    at::Tensor normed;
    if (layer == 0) {
      residual = hidden;
      normed = rms_norm.call(hidden, input_norm, eps);
    } else {
      std::tie(normed, residual) = add_norm.call(hidden, residual, input_norm, eps);
    }
    const at::Tensor qkv = linear(normed, weights, base + kQkv, base + kQkvScales,
                                  weights.get(base + kQkvBias), qkv_size);
    at::Tensor kv_cache = kv_caches[layer];
    const at::Tensor q = rotary.call(qkv, positions, cos_sin, kv_cache, slot_mapping, num_heads,
                                     num_kv_heads);
    const at::Tensor attended = at::empty(q.sizes(), q.options());
    attend.call(attended, q, kv_cache, block_tables, lens, rows, seqs, scale, 0, 0.0,
                std::nullopt);
    const at::Tensor o = linear(attended.view({num_tokens, -1}), weights, base + kO,
                                base + kOScales, weights.get(base + kOBias), hidden_size);
    std::tie(normed, residual) = add_norm.call(o, residual, *weights.get(base + kPostNorm), eps);
    const at::Tensor gate_up = *weights.get(base + kGateUp);
    at::Tensor gated;
    if (!weights.get(base + kGateUpScales).has_value() && !gate_up.is_mkldnn()) {
      gated = gated_f32.call(normed, gate_up, intermediate_size, gelu);
    } else {
      const at::Tensor up = linear(normed, weights, base + kGateUp, base + kGateUpScales, {},
                                   2 * intermediate_size);
      gated = gelu ? gelu_tanh.call(up) : silu.call(up);
    }
    hidden = linear(gated, weights, base + kDown, base + kDownScales, {}, hidden_size);
  }
  return std::get<0>(add_norm.call(hidden, residual, final_norm, eps));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(baton_cpu, m) {
  m.def(
      "decoder_layers(Tensor hidden, Tensor positions, Tensor cos_sin, Tensor(a!)[] kv_caches, "
      "Tensor slot_mapping, Tensor block_tables, Tensor lens, Tensor rows, Tensor seqs, "
      "Tensor?[] weights, Tensor final_norm, int num_heads, int num_kv_heads, "
      "int intermediate_size, float scale, float eps, bool gelu) -> Tensor");
}

TORCH_LIBRARY_IMPL(baton_cpu, CPU, m) { m.impl("decoder_layers", &decoder_layers); }

// oneDNN's packed weights are MkldnnCPU tensors, and the dispatcher picks the kernel by the
// highest key among all arguments.
TORCH_LIBRARY_IMPL(baton_cpu, MkldnnCPU, m) { m.impl("decoder_layers", &decoder_layers); }
