// The vocabulary-parallel cross entropy as one autograd function: three per-token
// reductions forward, a local backward.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/vocab_parallel_cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dscpp/ops/vocab_parallel_kernels.h"

namespace dscpp::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void reduce(at::Tensor& t, const GroupPtr& group, comm::ReduceOp op) {
  if (tensor_model_parallel_size(group) > 1) group->all_reduce(t, op).wait();
}

// On CUDA (bf16/fp16/fp32 logits): two kernel passes over the shard around two collectives,
// the row max (MAX) and the sum of exponentials with the target's logit in one buffer (SUM);
// backward one pass writing the gradient in the logits' dtype. Saved: the logits themselves
// and two fp32 values per token, never an fp32 copy of the shard.
struct FusedVocabParallelCrossEntropy : torch::autograd::Function<FusedVocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, const GroupPtr& group) {
    const int64_t part = logits.size(-1);
    const int64_t start = tensor_model_parallel_rank(group) * part;
    const at::Tensor x = logits.reshape({-1, part});
    const at::Tensor t = target.reshape({-1}).contiguous();
    at::Tensor row_max = ops::vocab_parallel::row_max(x);
    reduce(row_max, group, comm::ReduceOp::kMax);
    at::Tensor sums = ops::vocab_parallel::sums(x, t, start, row_max);
    reduce(sums, group, comm::ReduceOp::kSum);
    const at::Tensor sum_exp = sums.select(0, 0).contiguous();
    const at::Tensor loss = sum_exp.log().sub(sums.select(0, 1));
    ctx->save_for_backward({x, t, row_max, sum_exp});
    ctx->saved_data["start"] = start;
    ctx->saved_data["sizes"] = logits.sizes().vec();
    return loss.view(target.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dx = ops::vocab_parallel::grad(
        grads[0], saved[0], saved[1], ctx->saved_data["start"].toInt(), saved[2], saved[3]);
    return {dx.view(ctx->saved_data["sizes"].toIntVector()), at::Tensor(), at::Tensor()};
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  // Backward communicates nothing: the group is needed in forward only.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, const GroupPtr& group) {
    const at::ScalarType acc = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor x = logits.to(acc);
    const int64_t partition_vocab = x.size(-1);
    const int64_t vocab_start = tensor_model_parallel_rank(group) * partition_vocab;

    // The row's max over every rank's columns, subtracted for a stable exp.
    at::Tensor logits_max = std::get<0>(x.max(-1)).contiguous();
    reduce(logits_max, group, comm::ReduceOp::kMax);
    const at::Tensor shifted = x - logits_max.unsqueeze(-1);

    // The target's (shifted) logit: from the rank owning it, zero elsewhere, then summed.
    const at::Tensor outside = (target < vocab_start) | (target >= vocab_start + partition_vocab);
    const at::Tensor local_target = at::where(outside, 0, target - vocab_start);
    at::Tensor predicted =
        shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0);
    predicted = predicted.contiguous();
    reduce(predicted, group, comm::ReduceOp::kSum);

    at::Tensor exp_logits = shifted.exp();
    at::Tensor sum_exp = exp_logits.sum(-1);
    reduce(sum_exp, group, comm::ReduceOp::kSum);

    at::Tensor loss = sum_exp.log() - predicted;
    // Saved for backward: this rank's softmax columns and where its target sits.
    exp_logits.div_(sum_exp.unsqueeze(-1));
    ctx->save_for_backward({exp_logits, local_target, outside});
    ctx->saved_data["dtype"] = logits.scalar_type();
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();  // softmax
    const at::Tensor& local_target = saved[1];
    const at::Tensor& outside = saved[2];
    // softmax - onehot(target), the onehot only where this rank owns the target.
    grad.scatter_add_(-1, local_target.unsqueeze(-1),
                      outside.logical_not().to(grad.scalar_type()).neg().unsqueeze(-1));
    grad.mul_(grads[0].unsqueeze(-1));
    return {grad.to(ctx->saved_data["dtype"].toScalarType()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& vocab_parallel_logits,
                                        const at::Tensor& target, const GroupPtr& group) {
  const at::Tensor& x = vocab_parallel_logits;
  if (!x.defined() || !target.defined() || x.dim() < 1 || !at::isFloatingType(x.scalar_type()) ||
      target.scalar_type() != at::kLong || target.sizes() != x.sizes().slice(0, x.dim() - 1))
    throw TensorParallelError(fmt::format(
        "vocab_parallel_cross_entropy: expected floating logits [..., V/t] and int64 targets "
        "[...] of the same leading shape, got logits [{}] ({}) and targets [{}] ({})",
        x.defined() ? fmt::format("{}", fmt::join(x.sizes(), ", ")) : "undefined",
        x.defined() ? c10::toString(x.scalar_type()) : "-",
        target.defined() ? fmt::format("{}", fmt::join(target.sizes(), ", ")) : "undefined",
        target.defined() ? c10::toString(target.scalar_type()) : "-"));
  const int64_t vocab = x.size(-1) * tensor_model_parallel_size(group);
  if (target.numel() > 0) {
    const int64_t lo = target.min().item<int64_t>(), hi = target.max().item<int64_t>();
    if (lo < 0 || hi >= vocab)
      throw TensorParallelError(fmt::format(
          "vocab_parallel_cross_entropy: targets span [{}, {}], outside the vocabulary [0, {}) "
          "({} columns x {} ranks)",
          lo, hi, vocab, x.size(-1), tensor_model_parallel_size(group)));
  }
  if (x.dim() >= 1 && x.size(-1) > 0 && target.numel() > 0 && x.is_contiguous() &&
      ops::vocab_parallel::kernels_apply(x.reshape({-1, x.size(-1)})))
    return FusedVocabParallelCrossEntropy::apply(x, target, group);
  return VocabParallelCrossEntropy::apply(x, target, group);
}

}  // namespace dscpp::nn
