// Megatron's LinearWithGradAccumulationAndAsyncCommunication (megatron/core/tensor_parallel/
// layers.py), the product of ColumnParallelLinear, Y = X Wᵀ + b with W this rank's
// [out/t, in], whose backward overlaps the input gradient's collective with the
// weight-gradient product:
//   backward: [sequence_parallel: issue the all-gather of X] -> grad_input = dY W ->
//             [wait for the all-gather] -> issue grad_input's all-reduce (sequence_parallel:
//             its reduce-scatter along dim 0) -> grad_weight = dYᵀ X, grad_bias -> wait.
// With sequence_parallel, x is this rank's [s/t, ..., in]: forward all-gathers it (blocking)
// and keeps only the shard for backward, where it is gathered again while grad_input is
// computed (the gathered activation's memory is not held between forward and backward).
// Megatron's gradient-accumulation fusion (into a main_grad) is not done here.
// On NCCL the collectives run on c10d's own stream and Work::wait() orders the current stream
// after them; on Gloo they run on its worker threads. The values are those of the synchronous
// mappings around nn::linear, bit for bit (the same products, reductions and order).
// num_splits > 1 (tp_comm_overlap, tp_comm_overlap.h): forward's all-gather is pipelined
// with its product in that many pieces of the shard's dim 0; 1: one gather, then the product.
// Like nn::linear it saves the weight parameter itself (ZeRO stage 3 re-gathers its storage).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::nn {

// x [..., in] (sequence_parallel: [s/t, ..., in]), weight [out/t, in], bias [out/t] or
// undefined -> [..., out/t] ([s, ..., out/t]). A group of size one (or null): nn::linear.
at::Tensor linear_with_async_communication(const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& bias, const GroupPtr& group,
                                           bool sequence_parallel, int64_t num_splits = 1);

// Test hook: while set, each backward of linear_with_async_communication appends its steps,
// in the order they run, to *trace: "issue all_gather", "grad_input", "wait all_gather",
// "issue all_reduce" / "issue reduce_scatter", "grad_weight", "grad_bias", "wait all_reduce"
// / "wait reduce_scatter"; each pipelined forward (num_splits > 1) its "issue all_gather
// piece", "wait all_gather piece", "product piece" steps. nullptr: off (the default). Not
// thread-safe: tests only.
void set_async_communication_trace(std::vector<std::string>* trace);

}  // namespace dscpp::nn
