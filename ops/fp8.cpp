// FP8 formats, scales and the scaled product (fp8.h).
#include "dscpp/ops/fp8.h"

#include <ATen/ATen.h>

#include <cmath>

#ifdef DSCPP_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dscpp/ops/kernel_dtype.h"
#include "dscpp/ops/kernel_launch.h"
#endif

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

at::Tensor factor_from_amax(const at::Tensor& amax, Format f, int margin) {
  return quantising_factor(amax, f, margin, false);
}

#ifdef DSCPP_CUDA
namespace {

// |x|'s maximum [1] (fp32) by ops/fp8_cast.cu's reduction; x contiguous, of a kernel type.
at::Tensor amax_cuda(const at::Tensor& x, cuda::DType type) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({1}, x.options().dtype(at::kFloat));
  cuda::launch_fp8_amax(x.data_ptr(), x.numel(), type, out.data_ptr<float>(),
                        c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  return out;
}

}  // namespace
#endif

at::Tensor amax(const at::Tensor& x) {
#ifdef DSCPP_CUDA
  if (x.is_cuda() && x.numel() > 0) {
    if (const auto type = cuda::kernel_dtype(x.scalar_type()))
      return amax_cuda(x.contiguous(), *type).reshape({});
  }
#endif
  return at::linalg_vector_norm(x, INFINITY).to(at::kFloat);
}

Quantized quantize(const at::Tensor& x, const at::Tensor& scale, Format f) {
  check_2d(x, "the tensor quantised");
  return quantize_by_factor(x, scale.to(at::kFloat).reciprocal(), f);
}

Quantized quantize_tensorwise(const at::Tensor& x, Format f, int margin) {
  return quantize_layouts(x, -1, f, margin, false, true, false).rows;
}

Quantized quantize_axiswise(const at::Tensor& x, int64_t reduced, Format f, int margin,
                            bool power_of_2) {
  return quantize_layouts(x, reduced, f, margin, power_of_2, true, false).rows;
}

namespace {

Quantized transposed(const Quantized& q) {
  return {q.data.t().contiguous(), q.scale.dim() == 2 ? q.scale.t() : q.scale};
}

#ifdef DSCPP_CUDA
// The one-pass kernel: the amax by one reduction (fp8_amax_kernel for one scale, the infinity
// norm along a dimension for a scale per slice: no |x| is written), then
// the cast into the layouts asked for, the factors taken from the amax on the device. With a
// `factor` given (one, delayed scaling's), no amax: the cast takes it as it is.
Layouts quantize_layouts_cuda(const at::Tensor& x_in, int64_t reduced, Format f, int margin,
                              bool power_of_2, bool want_rows, bool want_transposed,
                              cuda::DType type, const at::Tensor& factor = {}) {
  const at::Tensor x = x_in.contiguous();
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), cols = x.size(1);
  const bool given = factor.defined();
  const at::Tensor amax =
      given ? factor.to(x.device(), at::kFloat).reshape({1}).contiguous()
      : reduced < 0
          ? amax_cuda(x, type)
          : at::linalg_vector_norm(x, INFINITY, {reduced}, false).to(at::kFloat).contiguous();
  const auto bytes = x.options().dtype(dtype(f));
  Layouts out;
  at::Tensor data = want_rows ? at::empty({rows, cols}, bytes) : at::Tensor();
  at::Tensor data_t = want_transposed ? at::empty({cols, rows}, bytes) : at::Tensor();
  at::Tensor scale = at::empty({amax.numel()}, x.options().dtype(at::kFloat));
  cuda::launch_fp8_cast(x.data_ptr(), amax.data_ptr<float>(), given, rows, cols, type,
                        reduced < 0    ? 0
                        : reduced == 1 ? 1
                                       : 2,
                        f == Format::E4M3 ? cuda::Fp8Kind::kE4M3 : cuda::Fp8Kind::kE5M2, margin,
                        power_of_2, want_rows ? data.data_ptr() : nullptr,
                        want_transposed ? data_t.data_ptr() : nullptr, scale.data_ptr<float>(),
                        c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  // The scale's shape as the composition gives it: scalar, [rows, 1] or [1, cols].
  const at::Tensor s = reduced < 0    ? scale.reshape({})
                       : reduced == 1 ? scale.view({rows, 1})
                                      : scale.view({1, cols});
  if (want_rows) out.rows = {data, s};
  if (want_transposed) out.transposed = {data_t, s.dim() == 2 ? s.t() : s};
  return out;
}
#endif

}  // namespace

Layouts quantize_layouts(const at::Tensor& x, int64_t reduced, Format f, int margin,
                         bool power_of_2, bool want_rows, bool want_transposed) {
  check_2d(x, "the tensor quantised");
  if (reduced < -1 || reduced > 1)
    throw Fp8Error("fp8: a scale is per tensor (-1) or along dimension 0 or 1, found " +
                   std::to_string(reduced));
#ifdef DSCPP_CUDA
  if (x.is_cuda() && x.numel() > 0) {
    if (const auto type = cuda::kernel_dtype(x.scalar_type()))
      return quantize_layouts_cuda(x, reduced, f, margin, power_of_2, want_rows, want_transposed,
                                   *type);
  }
#endif
  const at::Tensor amax = reduced < 0 ? x.abs().amax() : x.abs().amax({reduced}, /*keepdim=*/true);
  const Quantized q = quantize_by_factor(x, quantising_factor(amax, f, margin, power_of_2), f);
  Layouts out;
  if (want_rows) out.rows = q;
  if (want_transposed) out.transposed = transposed(q);
  return out;
}

Layouts quantize_layouts_by_factor(const at::Tensor& x, const at::Tensor& factor, Format f,
                                   bool want_rows, bool want_transposed) {
  check_2d(x, "the tensor quantised");
  if (factor.numel() != 1)
    throw Fp8Error("fp8: a known factor is one value, found " + std::to_string(factor.numel()));
#ifdef DSCPP_CUDA
  if (x.is_cuda() && x.numel() > 0) {
    if (const auto type = cuda::kernel_dtype(x.scalar_type()))
      return quantize_layouts_cuda(x, -1, f, 0, false, want_rows, want_transposed, *type, factor);
  }
#endif
  const Quantized q = quantize_by_factor(x, factor.to(at::kFloat), f);
  Layouts out;
  if (want_rows) out.rows = q;
  if (want_transposed) out.transposed = transposed(q);
  return out;
}

at::Tensor scaled_mm(const Quantized& a, const Quantized& b, at::ScalarType out_dtype,
                     const at::Tensor& bias) {
  check_2d(a.data, "a");
  check_2d(b.data, "b");
  const bool per_tensor = a.scale.numel() == 1 && b.scale.numel() == 1;
  if (per_tensor || a.data.is_cuda()) {
    at::Tensor sa = per_tensor ? a.scale.reshape({}) : a.scale;
    at::Tensor sb = per_tensor ? b.scale.reshape({}) : b.scale;
    std::optional<at::Tensor> add;
    if (bias.defined()) add = bias.to(out_dtype);
    return at::_scaled_mm(a.data, b.data, sa, sb, add, std::nullopt, out_dtype);
  }
  // CPU, per-row scales: the unit-scaled product in fp32, then each row and column scaled.
  at::Tensor one = at::ones({}, a.scale.options());
  at::Tensor p = at::_scaled_mm(a.data, b.data, one, one, std::nullopt, std::nullopt, at::kFloat);
  p = p * a.scale * b.scale;
  if (bias.defined()) p.add_(bias.to(at::kFloat));
  return p.to(out_dtype);
}

at::Tensor dequantize(const Quantized& q) {
  return q.data.to(at::kFloat) * q.scale;
}

}  // namespace dscpp::ops::fp8
