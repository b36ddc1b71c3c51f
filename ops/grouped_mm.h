// The local experts' products as one grouped GEMM: rows [N, in] in consecutive groups of
// counts[e] rows (int64 [E], summing to at most N), weights [E, in, out] -> [N, out], row
// block e times weights[e]. Rows past sum(counts) are padding (the MoE permutation's GPU path
// leaves them): never read into a product, their output rows unspecified (zero on the loop).
// Differentiable: d_rows is the grouped product of the output's gradient with the transposed
// weights, d_weights[e] = rows_e^T grad_e (zeros for an empty group).
//
// Which path runs: ATen's at::_grouped_mm (LibTorch 2.11: cuBLAS/CUTLASS on a GPU, its
// reference loop elsewhere) when rows and weights share a dtype among fp32, bf16 and fp16 and
// every matrix stride is a multiple of 16 bytes (in and out multiples of 16 / element size;
// _grouped_mm's rule, which ignores rows past the last offset); then the group offsets are
// formed on the device, and nothing waits on the host (counts are checked against N on the
// CPU only). Otherwise (float64, unaligned widths) a loop of at::mm over the groups, which
// reads counts on the host. Output: rows' dtype.
#pragma once

#include <ATen/core/Tensor.h>

namespace dscpp::ops {

// offsets: int32 [E], the inclusive running sum of counts on rows' device (grouped_mm_offsets),
// when the caller runs several products on one grouping; undefined: formed here (two small
// kernels, again in backward).
at::Tensor grouped_mm(const at::Tensor& rows, const at::Tensor& weights, const at::Tensor& counts,
                      const at::Tensor& offsets = {});

// The offsets grouped_mm forms from counts: cumsum(counts) as int32 on `device`.
at::Tensor grouped_mm_offsets(const at::Tensor& counts, const at::Device& device);

// The loop of products (the reference the tests and the benchmark compare with), not
// differentiable by itself.
at::Tensor grouped_mm_loop(const at::Tensor& rows, const at::Tensor& weights,
                           const at::Tensor& counts);

// Whether grouped_mm takes ATen's grouped path for these operands.
bool grouped_mm_uses_aten(const at::Tensor& rows, const at::Tensor& weights);

}  // namespace dscpp::ops
