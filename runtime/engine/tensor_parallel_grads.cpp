// TensorParallelGrads: see tensor_parallel_grads.h.
#include "dscpp/runtime/engine/tensor_parallel_grads.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "dscpp/error.h"

namespace dscpp {

TensorParallelGrads::TensorParallelGrads(zero::ZeroOptimizer& zero,
                                         std::shared_ptr<comm::ProcessGroup> model_group,
                                         std::vector<nn::TensorParallelAttr> attrs)
    : zero_(zero), group_(std::move(model_group)), attrs_(std::move(attrs)) {
  if (!group_) throw Error("TensorParallelGrads: no model-parallel group");
  if (attrs_.size() != zero_.params().size())
    throw Error("TensorParallelGrads: " + std::to_string(attrs_.size()) +
                " parameter attributes for " + std::to_string(zero_.params().size()) +
                " trainable parameters");
  for (const auto& a : attrs_) any_sp_ |= a.sequence_parallel;
}

std::vector<TensorParallelGrads::Slice> TensorParallelGrads::slices(int param) const {
  // As pipe/tied_grads.cpp: the parameter's elements inside this rank's chunk of its bucket
  // (the whole parameter at stage 0, whose one partition is the whole buffer).
  const auto& layout = zero_.layout();
  const auto& p = layout.params.at(param);
  const auto& b = layout.buckets.at(p.bucket);
  const int64_t mine_begin = b.begin + zero_.layout_rank() * b.chunk,
                mine_end = mine_begin + b.chunk;
  const int64_t lo = std::max(p.offset, mine_begin), hi = std::min(p.offset + p.numel, mine_end);
  if (lo >= hi) return {};
  return {{b.part_offset + (lo - mine_begin), hi - lo}};
}

void TensorParallelGrads::all_reduce_sequence_parallel() {
  if (!any_sp_ || group_->size() == 1) return;
  at::NoGradGuard no_grad;
  at::Tensor grads = zero_.grad_partition();
  std::vector<at::Tensor> pieces;
  std::vector<Slice> where;
  for (size_t i = 0; i < attrs_.size(); ++i) {
    if (!attrs_[i].sequence_parallel) continue;
    for (const Slice& s : slices(static_cast<int>(i))) {
      pieces.push_back(grads.narrow(0, s.part, s.numel));
      where.push_back(s);
    }
  }
  // Every model rank runs the collective, even one whose chunk holds none of them (a flat
  // tensor of 0 elements): the layouts agree, so in practice all hold the same slices.
  at::Tensor flat = pieces.empty() ? at::zeros({0}, grads.options()) : at::cat(pieces);
  group_->all_reduce(flat).wait();
  int64_t pos = 0;
  for (const Slice& s : where) {
    grads.narrow(0, s.part, s.numel).copy_(flat.narrow(0, pos, s.numel));
    pos += s.numel;
  }
}

at::Tensor TensorParallelGrads::duplicate_sumsq() const {
  const at::Tensor& grads = zero_.grad_partition();
  at::Tensor sum = at::zeros({}, grads.options().dtype(at::kFloat));
  const int tp_rank = group_->rank();
  for (size_t i = 0; i < attrs_.size(); ++i) {
    if (nn::param_is_not_tensor_parallel_duplicate(attrs_[i], tp_rank)) continue;
    for (const Slice& s : slices(static_cast<int>(i)))
      sum += grads.narrow(0, s.part, s.numel).to(at::kFloat).square().sum();
  }
  return sum;
}

}  // namespace dscpp
