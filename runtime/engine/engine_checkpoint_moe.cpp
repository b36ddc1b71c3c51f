// The engine's side of DeepSpeed's MoE checkpoint layout: see moe_checkpoint.h.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/moe_checkpoint.h"

namespace dscpp::engine_checkpoint {

Experts module_experts(const torch::nn::Module* module) {
  return module ? nn::moe::expert_parameters(*module) : Experts{};
}

void to_moe_model_states(PyValue& model, const Experts& experts) {
  const PyValue* module = model.find(PyValue("module"));
  if (module && module->is_dict()) {
    // DeepSpeed's _get_non_moe_state_dict: the expert tensors live in their own files only.
    PyValue dense = PyValue::ordered_dict();
    for (size_t i = 0; i < module->size(); ++i) {
      const PyValue& k = module->keys()[i];
      if (!k.is_string() || !experts.count(k.as_string())) dense.set(k, module->values()[i]);
    }
    model.set(PyValue("module"), std::move(dense));
  }
  PyValue counts = PyValue::list();
  for (int64_t n : checkpoint::num_experts_per_layer(experts)) counts.append(PyValue(n));
  model.set(PyValue("num_experts"), std::move(counts));
  model.set(PyValue("ds_autoep_layers"), PyValue());
  model.set(PyValue("dscpp_moe"), checkpoint::moe_info(experts));
}

int64_t saved_ep_size(const PyValue& model) {
  const PyValue* info = model.is_dict() ? model.find(PyValue("dscpp_moe")) : nullptr;
  return info && info->is_dict() ? info->at(PyValue("ep_size")).as_int() : 1;
}

PyValue moe_model_view(const std::string& dir, const std::string& tag, const PyValue& model,
                       const std::string& path, const Experts& experts) {
  const PyValue* counts = model.find(PyValue("num_experts"));
  if (experts.empty()) {
    if (counts)
      throw CheckpointError("'" + path + "' is a MoE checkpoint (num_experts), the model has " +
                            "no expert parameters");
    return model;
  }
  auto files = checkpoint::ExpertFiles::of_model(dir, tag, model, path);
  files.check_model(experts);
  PyValue view = model;
  view.set(PyValue("module"),
           checkpoint::module_with_experts(need(model, "module", path), experts, files));
  return view;
}

ExpertRelayout::ExpertRelayout(const std::string& dir, const std::string& tag, const PyValue& model,
                               const std::string& path)
    : where_(checkpoint::tag_dir(dir, tag)) {
  const Experts saved = checkpoint::experts_of_info(model, path);
  const int64_t ep = saved_ep_size(model);
  if (ep != 1)
    throw CheckpointError(fmt::format(
        "'{}' was saved at expert-parallel degree {}: re-laying out its expert optimizer "
        "state needs the expert-data ZeRO optimizer's files, which this build does not read",
        path, ep));
  // At ep 1 every rank holds every expert: the saving ranks' view is the one-rank model's.
  auto files = checkpoint::ExpertFiles::of_model(dir, tag, model, path);
  PyValue view = model;
  const PyValue module = checkpoint::module_with_experts(need(model, "module", path), saved, files);
  view.set(PyValue("module"), module);
  for (auto& p : checkpoint::consolidate_params(
           view, path, module, [&](int r) { return checkpoint::find_zero_states(dir, tag, r); })) {
    auto e = saved.find(p.name);
    if (e == saved.end()) {
      by_key_[p.name] = std::move(p);
      continue;
    }
    for (const auto& slot : checkpoint::expert_slots(p.name, e->second)) {
      auto cut = [&](const at::Tensor& t) {
        return slot.slice < 0 ? t : t.select(0, slot.slice).contiguous();
      };
      checkpoint::UniversalParam q;
      q.name = slot.key;
      q.fp32 = cut(p.fp32);
      for (const auto& [s, t] : p.states) q.states[s] = cut(t);
      q.step = p.step;
      q.partition = checkpoint::ParamPartition::whole(q.fp32.sizes().vec());
      by_key_[slot.key] = std::move(q);
    }
  }
}

checkpoint::UniversalParam ExpertRelayout::param(const std::string& name,
                                                 const Experts& experts) const {
  auto find = [&](const std::string& key) -> const checkpoint::UniversalParam& {
    auto it = by_key_.find(key);
    if (it == by_key_.end())
      throw CheckpointError(fmt::format(
          "MoE checkpoint '{}' holds no parameter '{}' (needed for '{}')", where_, key, name));
    return it->second;
  };
  auto e = experts.find(name);
  if (e == experts.end()) return find(name);
  const auto slots = checkpoint::expert_slots(name, e->second);
  checkpoint::UniversalParam out;
  if (e->second.local_expert >= 0) {
    out = find(slots.at(0).key);
  } else {
    std::vector<const checkpoint::UniversalParam*> parts;
    for (const auto& s : slots) parts.push_back(&find(s.key));
    auto stack = [&](const std::function<at::Tensor(const checkpoint::UniversalParam&)>& of) {
      std::vector<at::Tensor> ts;
      for (const auto* p : parts) ts.push_back(of(*p));
      return at::stack(ts);
    };
    out.fp32 = stack([](const checkpoint::UniversalParam& p) { return p.fp32; });
    for (const auto& entry : parts[0]->states) {
      const std::string& s = entry.first;
      out.states[s] = stack([&](const checkpoint::UniversalParam& p) {
        auto it = p.states.find(s);
        if (it == p.states.end())
          throw CheckpointError(
              fmt::format("MoE checkpoint '{}': '{}' has no {}", where_, p.name, s));
        return it->second;
      });
    }
    out.step = parts[0]->step;
  }
  out.name = name;
  out.partition = checkpoint::ParamPartition::whole(out.fp32.sizes().vec());
  return out;
}

}  // namespace dscpp::engine_checkpoint
