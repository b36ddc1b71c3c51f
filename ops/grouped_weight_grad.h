// The experts' weight gradient written where the caller says: dw[e] = rows_e^T grad_e, rows_e
// and grad_e the counts[e] consecutive rows of group e (rows [N, in], grad [N, out], dw
// [E, in, out]); with accumulate, added to what dw[e] holds (beta = 1), which is what lets
// ZeRO's gradient buffer take the product's result without an add pass of its own (ATen's
// _grouped_mm returns a new tensor and has no beta). An empty group's dw[e] is zeroed (left as
// it is when accumulating). counts are on the host: cuBLAS's grouped GEMM takes its shapes from
// there.
//
// Which path runs: with WeightGradKernel::kGrouped on a CUDA device (DSCPP_CUDA build) with
// bf16, fp16 or fp32 operands whose rows are 16-byte multiples, one cublasGemmGroupedBatchedEx
// call (fp32 accumulation); otherwise a loop of at::mm_out / addmm_ over the groups (one cuBLAS
// GEMM each on a GPU). Throws dscpp::Error on shapes, dtypes or counts that do not fit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dscpp::ops {

enum class WeightGradKernel { kGrouped, kLoop };

// Whether ops::grouped_mm's backward writes the weight gradient into a gradient destination, and
// by which kernel, one setting for the process: "auto" (the default: a GEMM per expert where
// per_expert_gemm_pays says so, else the gradient returned to autograd), "loop" (a GEMM per
// expert always), "grouped" (cuBLAS's grouped GEMM), or "off" (returned to autograd, which adds
// it into the buffer). A benchmarking switch (train_gpt's --grouped-wgrad); the library reads no
// environment for it (the launch contract is all it reads).
struct GroupedWeightGradMode {
  bool into_destination;
  bool automatic;
  WeightGradKernel kernel;
};
// Throws dscpp::Error naming `name` unless it is auto, loop, grouped or off.
GroupedWeightGradMode parse_grouped_weight_grad_mode(const std::string& name);
GroupedWeightGradMode grouped_weight_grad_mode();
// Set before training starts (it is read by backward passes on autograd's threads).
void set_grouped_weight_grad_mode(GroupedWeightGradMode mode);

// Whether a GEMM per non-empty expert into the slot should beat ATen's grouped product followed
// by the buffer's add over every expert (measured on the H200, docs/perf-log/2026-12-04.md:
// with balanced routing the per-expert GEMMs of a [1,024, 2,048] gradient fill half the
// SMs and take twice as long; where one GEMM's output tiles fill the GPU, or most experts got no
// rows, whose blocks the loop skips and the add still reads, they win). Always true off a GPU.
bool per_expert_gemm_pays(const at::Tensor& dw, const std::vector<int64_t>& counts);

void grouped_weight_grad_into(const at::Tensor& dw, const at::Tensor& rows, const at::Tensor& grad,
                              const std::vector<int64_t>& counts, bool accumulate,
                              WeightGradKernel kernel = grouped_weight_grad_mode().kernel);

// Whether grouped_weight_grad_into takes cuBLAS's grouped GEMM for these operands.
bool grouped_weight_grad_uses_cublas(const at::Tensor& dw, const at::Tensor& rows,
                                     const at::Tensor& grad);

}  // namespace dscpp::ops
