// The FLOP and MAC count of one operator call, from its name and input shapes, with DeepSpeed's
// flops profiler's formulas (deepspeed/profiling/flops_profiler/profiler.py) where it has one:
// a matrix product of m*k by k*n is m*k*n MACs and 2*m*k*n flops (a linear's bias is not
// counted; addmm's and baddbmm's added input counts one flop per element); attention counts
// its two products over the whole score matrix (causal or not); layer_norm 5 flops per element
// (4 without affine); softmax, GELU and the other activations, elementwise arithmetic (over the
// broadcast shape) and reductions one per element; dropout and embedding lookups none.
// Names are the dispatcher's ("aten::mm") and our own ops' ("dscpp::linear", "dscpp::fp8_linear",
// "dscpp::bias_gelu", "dscpp::cross_entropy"). An operator with a formula is counted once, as
// a whole: the profiler skips what it calls (aten::linear's addmm).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace dscpp::profiler {

struct OpCost {
  int64_t flops = 0;
  int64_t macs = 0;  // multiply-accumulates of matrix products and convolutions; 0 elsewhere
};

// nullopt: no formula for `name` (a view, a copy, an op whose callees are counted instead).
// Inputs that are not what the formula expects (an undefined tensor, a missing argument)
// give zero, never an error: the profiler observes, it must not break the forward.
std::optional<OpCost> op_cost(std::string_view name, c10::ArrayRef<const c10::IValue> inputs);

// Whether op_cost knows `name` (cheap: no inputs needed).
bool has_formula(std::string_view name);

}  // namespace dscpp::profiler
