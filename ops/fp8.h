// 8-bit floating point for matrix products: the two formats, the scales of each scaling
// recipe, and the scaled product (at::_scaled_mm). A scale is the dequantising factor, as
// _scaled_mm takes it: high precision ≈ fp8 value × scale. A tensor's scale is its absolute
// maximum over the format's largest finite value (448 for e4m3, 57344 for e5m2), times 2^margin
// (Megatron's fp8_margin: headroom for values that grow before the next scale). Values beyond
// the range saturate to it rather than becoming inf.
//
// Scales are per tensor (a scalar) or per row: one per slice along the product's reduced
// dimension, so that the row scales factor out of the sum (torchao's "rowwise" recipe, which
// also rounds each scale to a power of two: the quantised values then carry no rounding of
// the scale itself). CPU: _scaled_mm takes only per-tensor scales there, so a per-row product
// multiplies the unit-scaled product by the outer product of the scales, which is the same
// sum in another order.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "dscpp/ops/fp8_error.h"

namespace dscpp::ops::fp8 {

enum class Format { E4M3, E5M2 };

// The format's largest finite value (448, 57344) and its ATen type (float8_e4m3fn, float8_e5m2).
double max_finite(Format f);
at::ScalarType dtype(Format f);
std::string name(Format f);

// An fp8 operand: data [rows, cols] in the format, and its fp32 scale: a scalar (per tensor),
// [rows, 1] (one per row) or [1, cols] (one per column).
struct Quantized {
  at::Tensor data;
  at::Tensor scale;
};

// The scale that maps amax (any shape) onto the format, amax · 2^margin / max, as torchao
// computes it: the quantising factor max / (amax · 2^margin) in float64, then fp32 (amax
// clamped to 1e-12), then its reciprocal. power_of_2 rounds the quantising factor down to a
// power of two (the scale up), so that no value overflows the range.
at::Tensor scale_from_amax(const at::Tensor& amax, Format f, int margin = 0,
                           bool power_of_2 = false);

// The quantising factor max / (amax · 2^margin), scale_from_amax's reciprocal (fp8 value = x ·
// factor): what delayed scaling keeps between steps, as Transformer Engine's `scale`.
at::Tensor factor_from_amax(const at::Tensor& amax, Format f, int margin = 0);

// x's absolute maximum as an fp32 scalar, by one reduction (no |x| written).
at::Tensor amax(const at::Tensor& x);

// x (2-D) in f with the given scale (scalar, [rows, 1] or [1, cols]), saturated to the range.
Quantized quantize(const at::Tensor& x, const at::Tensor& scale, Format f);

// One scale for all of x (2-D).
Quantized quantize_tensorwise(const at::Tensor& x, Format f, int margin = 0);

// One scale per slice of x (2-D) along `reduced` (the dimension the amax runs over): 1 gives a
// scale per row ([rows, 1]), 0 one per column ([1, cols]).
Quantized quantize_axiswise(const at::Tensor& x, int64_t reduced, Format f, int margin = 0,
                            bool power_of_2 = true);

// x (2-D) quantised in the layouts asked for, from one reading of x on CUDA (ops/fp8_cast.cu;
// the ATen composition elsewhere, the same values): `rows` is x itself, `transposed` is xᵀ
// [cols, rows] row-major with its scale transposed (scalar, [1, rows] or [cols, 1]), the form
// a product's operand takes without a copy. reduced -1: one scale (as quantize_tensorwise); 0
// or 1: one per slice along it (as quantize_axiswise). A layout not asked for stays empty.
struct Layouts {
  Quantized rows;
  Quantized transposed;
};
Layouts quantize_layouts(const at::Tensor& x, int64_t reduced, Format f, int margin,
                         bool power_of_2, bool want_rows, bool want_transposed);

// x (2-D) quantised by a factor already known (one value: delayed scaling's), saturated to the
// range, in the layouts asked for (by the one-pass kernel on CUDA, as quantize_layouts); the
// scale is the factor's reciprocal.
Layouts quantize_layouts_by_factor(const at::Tensor& x, const at::Tensor& factor, Format f,
                                   bool want_rows, bool want_transposed);

// a [m, k] (scale scalar or [m, 1]) times b [k, n] (scale scalar or [1, n]) -> [m, n] of
// out_dtype, accumulated in fp32. On CUDA b must be column-major (the transpose of a
// contiguous [n, k]) and m, k, n multiples of 16, as _scaled_mm requires; on the CPU any layout.
// A bias [n] is added in fp32 before the one rounding to out_dtype, inside the product where
// _scaled_mm takes it (a broadcast add after it cost 78 µs a call at 1.31 B: perf-log
// 2026-12-07 M).
at::Tensor scaled_mm(const Quantized& a, const Quantized& b, at::ScalarType out_dtype,
                     const at::Tensor& bias = {});

// The high-precision tensor a quantised one stands for (data · scale, fp32): the references'.
at::Tensor dequantize(const Quantized& q);

}  // namespace dscpp::ops::fp8
