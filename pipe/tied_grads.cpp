// Tied gradients: see tied_grads.h.
#include "dscpp/pipe/tied_grads.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "dscpp/error.h"

namespace dscpp::pipe {

TiedGrads::TiedGrads(const PipelineModule& module, zero::ZeroOptimizer& zero) : zero_(zero) {
  const auto named = module.stage_module()->named_parameters(/*recurse=*/true);
  const auto& params = zero.params();
  for (const auto& t : module.tied()) {
    std::vector<std::string> names;
    for (const auto& w : t.params) names.push_back(t.module_name + "." + w);
    if (t.params.empty())
      for (const auto& item : named)
        if (item.key().rfind(t.module_name + ".", 0) == 0) names.push_back(item.key());
    for (const auto& name : names) {
      const at::Tensor* p = named.find(name);
      if (!p)
        throw Error(
            fmt::format("PipelineModule: tied weight '{}' of key '{}' is not a parameter "
                        "of the stage",
                        name, t.key));
      int index = -1;
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].unsafeGetTensorImpl() == p->unsafeGetTensorImpl())
          index = static_cast<int>(i);
      if (index < 0)
        throw Error(fmt::format("PipelineModule: tied weight '{}' of key '{}' is not trainable",
                                name, t.key));
      weights_.push_back({&t, index, module.stage_id() != t.stages.front()});
    }
  }
}

std::vector<TiedGrads::Slice> TiedGrads::slices(int param) const {
  const auto& layout = zero_.layout();
  const auto& p = layout.params.at(param);
  const auto& b = layout.buckets.at(p.bucket);
  const int r = zero_.layout_rank();
  const int64_t mine_begin = b.begin + r * b.chunk, mine_end = mine_begin + b.chunk;
  const int64_t lo = std::max(p.offset, mine_begin), hi = std::min(p.offset + p.numel, mine_end);
  if (lo >= hi) return {};
  return {{lo - p.offset, hi - p.offset, b.part_offset + (lo - mine_begin)}};
}

void TiedGrads::all_reduce() {
  at::NoGradGuard no_grad;
  const at::Tensor& grads = zero_.grad_partition();
  const bool whole = zero_.stage() == 0;  // every data rank holds the whole averaged gradient
  for (const auto& w : weights_) {
    const int64_t numel = zero_.layout().params.at(w.param).numel;
    if (whole) {
      at::Tensor g = grads.narrow(0, zero_.layout().params.at(w.param).offset, numel);
      at::Tensor sum = g.clone();
      w.tied->same_data->all_reduce(sum, comm::ReduceOp::kSum).wait();
      g.copy_(sum);
      continue;
    }
    at::Tensor full = at::zeros({numel}, grads.options());
    const auto mine = slices(w.param);
    for (const auto& s : mine)
      full.slice(0, s.begin, s.end).copy_(grads.slice(0, s.part, s.part + (s.end - s.begin)));
    w.tied->all_data->all_reduce(full, comm::ReduceOp::kSum).wait();
    for (const auto& s : mine)
      grads.slice(0, s.part, s.part + (s.end - s.begin)).copy_(full.slice(0, s.begin, s.end));
  }
}

at::Tensor TiedGrads::duplicate_sumsq() const {
  const at::Tensor& grads = zero_.grad_partition();
  at::Tensor sum = at::zeros({}, grads.options().dtype(at::kFloat));
  for (const auto& w : weights_) {
    if (!w.copy) continue;
    for (const auto& s : slices(w.param)) {
      at::Tensor g = grads.slice(0, s.part, s.part + (s.end - s.begin)).to(at::kFloat);
      sum += g.square().sum();
    }
  }
  return sum;
}

}  // namespace dscpp::pipe
