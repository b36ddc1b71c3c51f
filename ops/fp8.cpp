// FP8 formats, scales and the scaled product (fp8.h).
#include "dscpp/ops/fp8.h"

#include <ATen/ATen.h>

#include <cmath>

namespace dscpp::ops::fp8 {

double max_finite(Format f) {
  return f == Format::E4M3 ? 448.0 : 57344.0;
}

at::ScalarType dtype(Format f) {
  return f == Format::E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

std::string name(Format f) {
  return f == Format::E4M3 ? "e4m3" : "e5m2";
}

namespace {

// max / (amax · 2^margin), float64 then fp32, as torchao's amax_to_scale; rounded down to a
// power of two on request (torchao's _round_scale_down_to_power_of_2: 2^floor(log2)).
at::Tensor quantising_factor(const at::Tensor& amax, Format f, int margin, bool power_of_2) {
  at::Tensor a = amax.to(at::kDouble).clamp_min(1e-12);
  at::Tensor q = (max_finite(f) / (a * std::ldexp(1.0, margin))).to(at::kFloat);
  if (power_of_2) q = at::exp2(at::floor(at::log2(q)));
  return q;
}

Quantized quantize_by_factor(const at::Tensor& x, const at::Tensor& factor, Format f) {
  const double m = max_finite(f);
  at::Tensor data = (x.to(at::kFloat) * factor).clamp(-m, m).to(dtype(f));
  return {data, factor.reciprocal()};
}

void check_2d(const at::Tensor& x, const char* what) {
  if (x.dim() != 2)
    throw Fp8Error(std::string("fp8: ") + what + " must be 2-D, got " + std::to_string(x.dim()) +
                   " dimensions");
}

}  // namespace

at::Tensor scale_from_amax(const at::Tensor& amax, Format f, int margin, bool power_of_2) {
  return quantising_factor(amax, f, margin, power_of_2).reciprocal();
}

Quantized quantize(const at::Tensor& x, const at::Tensor& scale, Format f) {
  check_2d(x, "the tensor quantised");
  return quantize_by_factor(x, scale.to(at::kFloat).reciprocal(), f);
}

Quantized quantize_tensorwise(const at::Tensor& x, Format f, int margin) {
  check_2d(x, "the tensor quantised");
  return quantize_by_factor(x, quantising_factor(x.abs().amax(), f, margin, false), f);
}

Quantized quantize_axiswise(const at::Tensor& x, int64_t reduced, Format f, int margin,
                            bool power_of_2) {
  check_2d(x, "the tensor quantised");
  at::Tensor amax = x.abs().amax({reduced}, /*keepdim=*/true);
  return quantize_by_factor(x, quantising_factor(amax, f, margin, power_of_2), f);
}

at::Tensor scaled_mm(const Quantized& a, const Quantized& b, at::ScalarType out_dtype) {
  check_2d(a.data, "a");
  check_2d(b.data, "b");
  const bool per_tensor = a.scale.numel() == 1 && b.scale.numel() == 1;
  if (per_tensor || a.data.is_cuda()) {
    at::Tensor sa = per_tensor ? a.scale.reshape({}) : a.scale;
    at::Tensor sb = per_tensor ? b.scale.reshape({}) : b.scale;
    return at::_scaled_mm(a.data, b.data, sa, sb, std::nullopt, std::nullopt, out_dtype);
  }
  // CPU, per-row scales: the unit-scaled product in fp32, then each row and column scaled.
  at::Tensor one = at::ones({}, a.scale.options());
  at::Tensor p = at::_scaled_mm(a.data, b.data, one, one, std::nullopt, std::nullopt, at::kFloat);
  return (p * a.scale * b.scale).to(out_dtype);
}

at::Tensor dequantize(const Quantized& q) {
  return q.data.to(at::kFloat) * q.scale;
}

}  // namespace dscpp::ops::fp8
