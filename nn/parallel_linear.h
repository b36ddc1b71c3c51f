// Megatron's ColumnParallelLinear and RowParallelLinear (megatron/core/tensor_parallel/
// layers.py) on a model-parallel group of t ranks, for Y = X Aᵀ + b with A [out, in]:
//
// ColumnParallelLinear: A split by rows (output features): rank r holds A_r [out/t, in] and
// b_r [out/t]. Input X whole on every rank (copied into the region: its gradient all-reduced),
// or, with sequence_parallel, this rank's 1/t of the sequence, dim 0 ([s/t, b, in]: all-gathered
// before the product, the gradient reduce-scattered). Output Y_r = X A_rᵀ + b_r [..., out/t],
// or all of Y with gather_output (not with sequence_parallel).
// async_tensor_model_parallel_allreduce (Megatron's option, default on): the product is
// linear_with_async_communication, whose backward overlaps the input gradient's all-reduce
// (sequence_parallel: its reduce-scatter, and the input's all-gather again) with the
// products; off: the synchronous mappings around nn::linear. Both give the same bits.
// tp_comm_overlap (Megatron's option, default off): forward's collectives pipelined with the
// products in tp_comm_overlap_num_splits pieces (tp_comm_overlap.h): the column layer's
// sequence-parallel all-gather (it needs async_tensor_model_parallel_allreduce; without
// sequence parallelism its forward has no collective), the row layer's all-reduce or
// reduce-scatter.
//
// RowParallelLinear: A split by columns (input features): rank r holds A_r [out, in/t]; b
// [out] whole. Input X_r [..., in/t] (input_is_parallel: as a column-parallel layer leaves it;
// otherwise X is whole and this rank's slice of its last dim is taken). Y = Σ_r X_r A_rᵀ,
// all-reduced, or with sequence_parallel reduce-scattered along dim 0 ([s/t, b, out]); b added
// once, after the reduction (under sequence_parallel b is marked so: its gradient is a partial
// sum over the sequence shards, nn::all_reduce_sequence_parallel_grads).
//
// skip_bias_add: the bias is not added but returned beside the output (forward's second value,
// undefined otherwise), for a later fused bias-add. Weights are initialised as
// parallel_weight_init.h says (t ranks hold the one-rank weight's slices); biases are zero.
// A null group or one of size one is the plain linear. Sizes that do not divide by t, and
// contradictory options, throw TensorParallelError naming them.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>
#include <utility>

#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/nn/tensor_parallel_attr.h"

namespace dscpp::nn {

struct ParallelLinearOptions {
  ParallelLinearOptions(int64_t input_size, int64_t output_size)
      : input_size_(input_size), output_size_(output_size) {}
  TORCH_ARG(int64_t, input_size);
  TORCH_ARG(int64_t, output_size);
  TORCH_ARG(bool, bias) = true;                // with a bias; false: none
  TORCH_ARG(bool, gather_output) = false;      // column: all of Y on every rank; false: Y_r
  TORCH_ARG(bool, input_is_parallel) = false;  // row: X arrives split; false: X whole
  TORCH_ARG(bool, skip_bias_add) = false;      // return the bias instead of adding it
  TORCH_ARG(bool, sequence_parallel) = false;  // Korthikanti et al.'s regions; false: off
  // column: backward's collectives overlapped with its products; false: synchronous mappings
  TORCH_ARG(bool, async_tensor_model_parallel_allreduce) = true;
  // Megatron's tp_comm_overlap: forward's collective pipelined with its product in
  // tp_comm_overlap_num_splits pieces (tp_comm_overlap.h); false: one collective, one product
  TORCH_ARG(bool, tp_comm_overlap) = false;
  TORCH_ARG(int64_t, tp_comm_overlap_num_splits) = 2;
  TORCH_ARG(int64_t, stride) = 1;  // Megatron's partition stride; 1: one slice
  TORCH_ARG(InitMethod, init_method) = init_method_normal();  // draws the master weight
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;              // the parameters' dtype
};

// forward's (output, output_bias): the bias only with skip_bias_add, undefined otherwise.
using LinearOutput = std::pair<at::Tensor, at::Tensor>;

class ColumnParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  ColumnParallelLinearImpl(const ParallelLinearOptions& options, GroupPtr group);
  LinearOutput forward(const at::Tensor& input);
  std::map<std::string, TensorParallelAttr> tensor_parallel_attributes() const override;

  ParallelLinearOptions options;
  GroupPtr group;
  int64_t output_size_per_partition = 0;
  at::Tensor weight;  // [output_size / t, input_size]
  at::Tensor bias;    // [output_size / t], or undefined
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  RowParallelLinearImpl(const ParallelLinearOptions& options, GroupPtr group);
  LinearOutput forward(const at::Tensor& input);
  std::map<std::string, TensorParallelAttr> tensor_parallel_attributes() const override;

  ParallelLinearOptions options;
  GroupPtr group;
  int64_t input_size_per_partition = 0;
  at::Tensor weight;  // [output_size, input_size / t]
  at::Tensor bias;    // [output_size] whole, or undefined
};
TORCH_MODULE(RowParallelLinear);

}  // namespace dscpp::nn
