// Megatron's tensor-parallel mappings (megatron/core/tensor_parallel/mappings.py): conjugate
// autograd functions on a model-parallel group, each named for what it does in forward; its
// backward is the conjugate collective. The parallel layers are built from these and nothing
// else communicates. `group` null or of size one: every mapping is the identity (no copy).
//
//   copy_to_tensor_model_parallel_region       identity          | all-reduce
//   reduce_from_tensor_model_parallel_region   all-reduce        | identity
//   scatter_to_tensor_model_parallel_region    split last dim    | all-gather last dim
//   gather_from_tensor_model_parallel_region   all-gather last   | split last dim
//   scatter_to_sequence_parallel_region        split dim 0       | all-gather dim 0
//   gather_from_sequence_parallel_region       all-gather dim 0  | reduce-scatter dim 0
//                                                                  (split, when the output's
//                                                                  gradient is not partial)
//   reduce_scatter_to_sequence_parallel_region reduce-scatter 0  | all-gather dim 0
//
// Splits give rank r the r-th of `size` equal chunks (the split dimension must divide: an
// nn::TensorParallelError otherwise). Sums are in the tensor's dtype, as Megatron's.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "dscpp/comm/process_group.h"

namespace dscpp::nn {

class TensorParallelError : public dscpp::Error {
 public:
  using dscpp::Error::Error;
};

using GroupPtr = std::shared_ptr<comm::ProcessGroup>;

// The group's size and this rank's place in it; 1 and 0 for a null group.
int tensor_model_parallel_size(const GroupPtr& group);
int tensor_model_parallel_rank(const GroupPtr& group);

at::Tensor copy_to_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor reduce_from_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor scatter_to_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor gather_from_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& x, const GroupPtr& group);
// tensor_parallel_output_grad: the output feeds tensor-parallel work (a column-parallel
// linear), so each rank's gradient is a partial sum: reduce-scatter it; false: the gradient is
// already whole on every rank: keep this rank's chunk.
at::Tensor gather_from_sequence_parallel_region(const at::Tensor& x, const GroupPtr& group,
                                                bool tensor_parallel_output_grad = true);
at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& x, const GroupPtr& group);

// DeepSpeed-Ulysses' all-to-alls (deepspeed/sequence/layer.py's _SeqAllToAll) on a
// sequence-parallel group of p ranks, each holding the sequence's p-th slice (rank order), on
// attention's [B, heads, S, d] layout; each is the other's backward. The heads split in whole
// key/value groups, so that a query head stays with its key/value head: of the model's
// `kv_heads` groups (n / kv_heads consecutive heads each; one for k and v), rank r takes the
// next kv_heads / p, and the first kv_heads % p ranks one more (DeepSpeed's split, uneven when
// p does not divide kv_heads). With c_r groups on rank r and n_r = c_r n / kv_heads heads:
//   all_to_all_sequence_to_heads  [B, n, S/p, d] -> [B, n_r, S, d]: rank r keeps heads
//                                 [n / kv_heads (c_0 + ... + c_{r-1}), ... + n_r)
//   all_to_all_heads_to_sequence  [B, n_r, S, d] -> [B, n, S/p, d]
// kv_heads must be at least p (a rank with no head has nothing to attend over) and divide n,
// as n_r must divide by c_r; a TensorParallelError naming the numbers otherwise.
at::Tensor all_to_all_sequence_to_heads(const at::Tensor& x, const GroupPtr& group,
                                        int64_t kv_heads);
at::Tensor all_to_all_heads_to_sequence(const at::Tensor& x, const GroupPtr& group,
                                        int64_t kv_heads);

}  // namespace dscpp::nn
