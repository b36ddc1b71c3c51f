// Column- and row-parallel linears: the mappings around nn::linear.
#include "dscpp/nn/parallel_linear.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dscpp/nn/linear.h"
#include "dscpp/nn/linear_async_communication.h"
#include "dscpp/nn/tp_comm_overlap.h"

namespace dscpp::nn {

namespace {

// Refused at construction: a split count below one.
void check_num_splits(const ParallelLinearOptions& o, const char* layer) {
  if (o.tp_comm_overlap() && o.tp_comm_overlap_num_splits() < 1)
    throw TensorParallelError(
        fmt::format("{}: tp_comm_overlap_num_splits must be at least 1, found {}", layer,
                    o.tp_comm_overlap_num_splits()));
}

int64_t per_partition(int64_t size, int64_t stride, const GroupPtr& group, const char* layer,
                      const char* what) {
  const int t = tensor_model_parallel_size(group);
  if (size <= 0 || size % (t * stride) != 0)
    throw TensorParallelError(
        fmt::format("{}: {} {} does not divide into {} tensor-parallel ranks x stride {}", layer,
                    what, size, t, stride));
  return size / t;
}

at::TensorOptions param_options(const ParallelLinearOptions& o) {
  return at::TensorOptions().dtype(o.dtype());
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const ParallelLinearOptions& options_,
                                                   GroupPtr group_)
    : options(options_), group(std::move(group_)) {
  if (options.gather_output() && options.sequence_parallel())
    throw TensorParallelError(
        "ColumnParallelLinear: gather_output and sequence_parallel cannot both be on (Megatron's "
        "rule: a sequence-parallel output stays split for the row-parallel layer)");
  if (options.tp_comm_overlap() && !options.async_tensor_model_parallel_allreduce())
    throw TensorParallelError(
        "ColumnParallelLinear: tp_comm_overlap needs async_tensor_model_parallel_allreduce (the "
        "pipelined all-gather is that function's forward; the synchronous mappings have none)");
  check_num_splits(options, "ColumnParallelLinear");
  output_size_per_partition = per_partition(options.output_size(), options.stride(), group,
                                            "ColumnParallelLinear", "output_size");
  weight = register_parameter(
      "weight",
      initialize_affine_weight({options.output_size(), options.input_size()}, 0, options.stride(),
                               tensor_model_parallel_rank(group), tensor_model_parallel_size(group),
                               options.init_method(), param_options(options)));
  if (options.bias())
    bias =
        register_parameter("bias", at::zeros({output_size_per_partition}, param_options(options)));
}

LinearOutput ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor b = options.skip_bias_add() ? at::Tensor() : bias;
  at::Tensor output_parallel;
  if (options.async_tensor_model_parallel_allreduce()) {
    output_parallel = linear_with_async_communication(
        input, weight, b, group, options.sequence_parallel(),
        options.tp_comm_overlap() ? options.tp_comm_overlap_num_splits() : 1);
  } else {
    // Sequence parallelism: the all-gather of the sequence shards replaces the copy; its
    // backward reduce-scatters the input's gradient (partial sums of every rank's columns).
    const at::Tensor input_parallel = options.sequence_parallel()
                                          ? gather_from_sequence_parallel_region(input, group)
                                          : copy_to_tensor_model_parallel_region(input, group);
    output_parallel = nn::linear(input_parallel, weight, b);
  }
  at::Tensor output = options.gather_output()
                          ? gather_from_tensor_model_parallel_region(output_parallel, group)
                          : output_parallel;
  return {output, options.skip_bias_add() ? bias : at::Tensor()};
}

std::map<std::string, TensorParallelAttr> ColumnParallelLinearImpl::tensor_parallel_attributes()
    const {
  std::map<std::string, TensorParallelAttr> out;
  out["weight"] = {true, 0, options.stride(), false};
  if (bias.defined()) out["bias"] = {true, 0, options.stride(), false};
  return out;
}

RowParallelLinearImpl::RowParallelLinearImpl(const ParallelLinearOptions& options_, GroupPtr group_)
    : options(options_), group(std::move(group_)) {
  if (options.sequence_parallel() && !options.input_is_parallel())
    throw TensorParallelError(
        "RowParallelLinear: sequence_parallel needs input_is_parallel (the input comes split "
        "from a column-parallel layer)");
  check_num_splits(options, "RowParallelLinear");
  input_size_per_partition = per_partition(options.input_size(), options.stride(), group,
                                           "RowParallelLinear", "input_size");
  weight = register_parameter(
      "weight",
      initialize_affine_weight({options.output_size(), options.input_size()}, 1, options.stride(),
                               tensor_model_parallel_rank(group), tensor_model_parallel_size(group),
                               options.init_method(), param_options(options)));
  if (options.bias())
    bias = register_parameter("bias", at::zeros({options.output_size()}, param_options(options)));
}

LinearOutput RowParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor input_parallel =
      options.input_is_parallel() ? input : scatter_to_tensor_model_parallel_region(input, group);
  at::Tensor reduced;
  if (options.tp_comm_overlap()) {
    reduced =
        row_parallel_linear_overlapped(input_parallel, weight, group, options.sequence_parallel(),
                                       options.tp_comm_overlap_num_splits());
  } else {
    const at::Tensor output_parallel = nn::linear(input_parallel, weight);
    reduced = options.sequence_parallel()
                  ? reduce_scatter_to_sequence_parallel_region(output_parallel, group)
                  : reduce_from_tensor_model_parallel_region(output_parallel, group);
  }
  // The bias once, after the sum: added before it, it would count t times.
  if (options.skip_bias_add() || !bias.defined()) return {reduced, bias};
  return {reduced + bias, at::Tensor()};
}

std::map<std::string, TensorParallelAttr> RowParallelLinearImpl::tensor_parallel_attributes()
    const {
  std::map<std::string, TensorParallelAttr> out;
  out["weight"] = {true, 1, options.stride(), false};
  if (bias.defined()) out["bias"] = {false, -1, 1, options.sequence_parallel()};
  return out;
}

}  // namespace dscpp::nn
