// expert_parameters: see expert_params.h.
#include "dscpp/nn/moe/expert_params.h"

#include "dscpp/comm/process_group.h"
#include "dscpp/nn/moe/experts.h"
#include "dscpp/nn/moe/moe.h"

namespace dscpp::nn::moe {

namespace {

void add_experts(const MoEImpl& moe, int layer, const std::string& name,
                 std::map<std::string, ExpertParam>& out) {
  const auto& experts = moe.deepspeed_moe->experts;
  ExpertParam base;
  base.moe_layer = layer;
  base.num_local_experts = moe.deepspeed_moe->local_experts->num_local_experts();
  base.ep_size = moe.options.ep_size();
  base.ep_rank = moe.options.ep_group() ? moe.options.ep_group()->rank() : 0;
  base.ep_group = moe.options.ep_group();
  const std::string under = name + "deepspeed_moe.experts.";
  if (const auto* clones = dynamic_cast<const ExpertsImpl*>(experts.get())) {
    for (size_t i = 0; i < clones->deepspeed_experts->size(); ++i) {
      const std::string at = under + "deepspeed_experts." + std::to_string(i) + ".";
      for (const auto& p : clones->deepspeed_experts->ptr(i)->named_parameters()) {
        ExpertParam e = base;
        e.local_expert = static_cast<int>(i);
        out.emplace(at + p.key(), e);
      }
    }
    return;
  }
  for (const auto& p : experts->named_parameters()) out.emplace(under + p.key(), base);
}

}  // namespace

std::map<std::string, ExpertParam> expert_parameters(const torch::nn::Module& root,
                                                     const std::string& prefix) {
  std::map<std::string, ExpertParam> out;
  int layer = 0;
  // named_modules lists a module before its children, in registration order: DeepSpeed's
  // moe_layer_id order (its MoE layers as model.modules() meets them). (Without the root:
  // listing it needs the root held by a shared_ptr.)
  if (const auto* moe = dynamic_cast<const MoEImpl*>(&root))
    add_experts(*moe, layer++, prefix.empty() ? "" : prefix + ".", out);
  for (const auto& m : root.named_modules(prefix, /*include_self=*/false)) {
    const auto* moe = dynamic_cast<const MoEImpl*>(m.value().get());
    if (!moe) continue;
    add_experts(*moe, layer++, m.key() + ".", out);
  }
  return out;
}

}  // namespace dscpp::nn::moe
