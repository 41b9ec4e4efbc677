// A gated MLP's act(gate) * up, compiled once (layer_ops_cpu.cpp) and called by both of its
// users: silu_and_mul / gelu_tanh_and_mul over an unfused linear's [gate | up] outputs, and the
// float32 linear's gated tiles (f32_linear_cpu.cpp), which gate their own sums. So both give
// the same floats. In one copy also because f32_linear_cpu.cpp is compiled without
// reassociation (ordered_sums.h), under which GCC neither inlines nor vectorizes the gate.
#pragma once

#include <cstdint>

namespace baton {

enum class Gate { kSilu, kGeluTanh };

// out[r * ldo + i] = act(x[r * ldx + i]) * x[r * ldx + up + i] for r < rows, i < width: the
// gate's `width` values of a row, then at `up` past them its up values. Hidden: no other
// library's copy (a benchmark's build of an older revision) stands in for this one's.
__attribute__((visibility("hidden"))) void gate_rows(Gate gate, const float* x, int64_t ldx,
                                                     int64_t up, float* out, int64_t ldo,
                                                     int64_t rows, int64_t width);

}  // namespace baton
