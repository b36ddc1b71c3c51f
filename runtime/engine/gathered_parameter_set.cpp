// EngineCore's gathering scopes over its set of partitions (gathered_parameter_set.h).
#include "dscpp/runtime/engine/gathered_parameter_set.h"

#include <map>

#include "dscpp/error.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/engine_experts.h"

namespace dscpp {

GatheredParameterSet EngineCore::gathered_parameters(std::vector<at::Tensor> params,
                                                     int modifier_rank) {
  // Each named tensor to the partition that holds it; none: the dense one (the first).
  std::map<const void*, size_t> holder;
  for (size_t p = 1; p < zero_set_.size(); ++p)
    for (const auto& t : zero_set_[p].zero->params()) holder.emplace(t.unsafeGetTensorImpl(), p);
  std::vector<std::vector<at::Tensor>> of(std::max<size_t>(zero_set_.size(), 1));
  for (auto& t : params) {
    auto it = t.defined() ? holder.find(t.unsafeGetTensorImpl()) : holder.end();
    of[it == holder.end() ? 0 : it->second].push_back(std::move(t));
  }
  std::vector<std::unique_ptr<zero::GatheredParameters>> scopes;
  auto sink = [this](const std::string& what) { defer_error(what); };
  for (size_t p = 0; p < of.size(); ++p) {
    if (p > 0 && of[p].empty()) continue;  // (the same on every rank of the partition's group)
    zero::ZeroOptimizer& z = p == 0 ? *zero_ : *zero_set_[p].zero;
    comm::ProcessGroup& g = p == 0 ? *group_ : *zero_set_[p].group;
    if (modifier_rank >= 0 && experts_ && &z == &experts_->zero())
      throw Error(
          "gathered_parameters: a modifier_rank with expert parameters of ep_size > 1 (each "
          "expert-parallel place holds other experts): gather them read only (modifier_rank -1)");
    scopes.push_back(
        std::make_unique<zero::GatheredParameters>(z, g, std::move(of[p]), modifier_rank, sink));
  }
  return GatheredParameterSet(std::move(scopes));
}

GatheredParameterSet EngineCore::gathered_whole() {
  std::vector<std::unique_ptr<zero::GatheredParameters>> scopes;
  if (zero_set_.empty()) {
    scopes.push_back(std::make_unique<zero::GatheredParameters>(*zero_));
  } else {
    for (const auto& p : zero_set_)
      scopes.push_back(std::make_unique<zero::GatheredParameters>(*p.zero));
  }
  return GatheredParameterSet(std::move(scopes));
}

}  // namespace dscpp
