// linear(x, weight, bias) = x · weightᵀ + bias, for modules that ZeRO stage 3 gathers layer
// by layer (DeepSpeed's LinearFunctionForZeroStage3). at::linear saves the transposed
// weight for backward: a view that keeps the gathered storage alive after the layer has
// released it, and never sees the storage gathered again for the backward. This function
// saves the parameter itself, which follows its storage from release to re-gather, so
// backward uses what was gathered for it. Numerically the same matrix products as at::linear,
// or their fp8 form inside an Fp8Autocast scope (fp8_linear.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace dscpp::nn {

// x [..., in], weight [out, in], bias [out] or undefined -> [..., out].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace dscpp::nn
