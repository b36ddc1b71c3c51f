// The GPU halves of nn::vocab_parallel_cross_entropy, on one rank's logit shard (the group's
// reductions between them are the caller's, so ops stays below comm): the row max; the sum of
// exponentials and the target's shifted logit; the gradient written straight into a tensor of
// the logits' dtype. They read bf16/fp16/fp32 logits as they are (no fp32 copy of the shard).
// logits: [rows, part] contiguous, the vocabulary's columns [start, start + part); targets:
// [rows] int64 on the same device. Each throws c10::Error where kernels_apply is false.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::ops::vocab_parallel {

// True in the CUDA build for contiguous 2-d CUDA logits of bf16, fp16 or fp32.
bool kernels_apply(const at::Tensor& logits);

// fp32 [rows]: each row's max over this shard.
at::Tensor row_max(const at::Tensor& logits);

// fp32 [2, rows]: [0] the sum of exp(logit - row_max), [1] the target's logit - row_max where
// this shard holds the target, else 0. row_max: the group's (after a MAX reduction).
at::Tensor sums(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                const at::Tensor& row_max);

// (softmax - onehot) * grad in logits' dtype, from the group's row_max and sum_exp; grad: [rows].
at::Tensor grad(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& targets,
                int64_t start, const at::Tensor& row_max, const at::Tensor& sum_exp);

}  // namespace dscpp::ops::vocab_parallel
