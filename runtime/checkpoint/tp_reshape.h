// Tensor-parallel shards to the logical tensor and back, from a tensor's partition metadata
// (universal.h's ParamPartition, the dscpp_partition entry: designed once, used by the
// engine's mp_rank_XX checkpoints, the pipeline's layer files, zero_to_fp32 and to_universal).
//
// A tensor of logical shape L cut along partition_dim over tp_degree ranks: without
// sub_param_sizes, rank r holds the r-th of the pieces partition_sizes gives (even when
// empty); with sub_param_sizes (a fused tensor: QKV's q, k and v rows, Megatron's
// partition_stride), each sub-part is cut evenly on its own and rank r holds its r-th piece of
// every sub-part, concatenated in order. Replicated (no partition_dim): every rank holds L.
// Shapes that do not fit the metadata throw CheckpointError naming the tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/universal.h"

namespace dscpp::checkpoint {

// The metadata of a tensor of `logical_shape` cut along partition_dim (none: replicated) over
// tp_degree ranks, `stride` interleaved equal sub-parts (Megatron's partition_stride; 1: one).
ParamPartition tensor_parallel_partition(std::vector<int64_t> logical_shape, int64_t tp_degree,
                                         std::optional<int64_t> partition_dim, int64_t stride = 1);
// The same layout at another degree (even pieces; partition_sizes dropped).
ParamPartition at_tp_degree(const ParamPartition& p, int64_t tp_degree);

// The shards of ranks 0..tp_degree-1 (in order) into the logical tensor; a replicated one
// is shards[0]. `name` for errors.
at::Tensor merge_tp_shards(const std::vector<at::Tensor>& shards, const ParamPartition& p,
                           const std::string& name);
// Rank `rank`'s shard of the logical tensor (a contiguous copy where it is cut).
at::Tensor tp_shard(const at::Tensor& logical, const ParamPartition& p, int64_t rank,
                    const std::string& name);
// Shards at p.tp_degree to shards at `to_degree`: merged, then re-cut.
std::vector<at::Tensor> reshape_tp_shards(const std::vector<at::Tensor>& shards,
                                          const ParamPartition& p, int64_t to_degree,
                                          const std::string& name);

}  // namespace dscpp::checkpoint
