// Megatron's vocab_parallel_cross_entropy: the cross entropy of logits split by vocabulary
// over a model group of t ranks (as a column-parallel output head leaves them: rank r holds
// the columns [r·V/t, (r+1)·V/t)), without gathering them. Per token, three all-reduces of
// one value each over the group: the row's max (MAX), the target's logit (SUM: only the owning
// rank contributes it) and the sum of exp(logit - max) (SUM). loss = log(sum_exp) - (target's
// logit - max). Backward needs no communication: each rank's gradient is softmax - onehot on
// its own columns, the onehot only on the rank owning the target.
//
// vocab_parallel_logits [..., V/t] floating point (computed in fp32, fp64 for fp64 input);
// target [...] int64 in [0, V). Returns the per-token loss [...] (no reduction; mask and
// average outside, as Megatron's loss functions do), in fp32 (fp64 for fp64 input). No label
// smoothing, no ignore_index. A target outside [0, V) is a TensorParallelError (checked on the
// host: a synchronisation on a GPU). The ATen composition runs on every device except for
// CUDA logits of bf16, fp16 or fp32 (contiguous), which take ops' kernels: a pass for the row
// max, all-reduce(MAX), a pass for the sum of exponentials and the target's logit, one
// all-reduce(SUM) of both; backward one pass writing softmax - onehot in the logits' dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::nn {

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& vocab_parallel_logits,
                                        const at::Tensor& target, const GroupPtr& group);

}  // namespace dscpp::nn
