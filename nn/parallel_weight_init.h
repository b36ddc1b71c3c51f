// Megatron's _initialize_affine_weight_cpu: the master weight of the full shape is drawn
// whole (fp32, on the host, by `init_method` from the default CPU generator, which the caller
// seeds identically on every rank of the model group), then each rank keeps its partition
// (partition_dim, stride: tensor_parallel_attr.h). So t ranks hold exactly the slices of the
// one-rank weight, bit for bit, for any t. The cost: each rank draws the whole master weight
// once (time and transient host memory of the unsharded tensor).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace dscpp::nn {

// Fills a tensor in place (the whole master weight).
using InitMethod = std::function<void(const at::Tensor&)>;

// normal(0, std) through nn::normal_init (the default: std 0.02, Megatron's init_method_std).
InitMethod init_method_normal(double std = 0.02);

// Rank `rank` of `world`'s partition of a master weight of `full_shape`, drawn by
// init_method, converted to `options` (dtype, device). full_shape[partition_dim] must split
// into world·stride equal pieces (TensorParallelError otherwise).
at::Tensor initialize_affine_weight(const std::vector<int64_t>& full_shape, int64_t partition_dim,
                                    int64_t stride, int rank, int world,
                                    const InitMethod& init_method,
                                    const at::TensorOptions& options);

// The partition of an existing full tensor: the same slicing (used by the initialisation and by
// tests and tools that cut a one-rank weight for a rank).
at::Tensor partition_of(const at::Tensor& full, int64_t partition_dim, int64_t stride, int rank,
                        int world);

}  // namespace dscpp::nn
