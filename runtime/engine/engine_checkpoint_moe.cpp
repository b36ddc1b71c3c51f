// The engine's side of DeepSpeed's MoE checkpoint layout: see moe_checkpoint.h; and
// EngineCore::load_moe_relayout, a MoE checkpoint loaded at another layout.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <map>
#include <set>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/moe_relayout.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/engine_experts.h"
#include "dscpp/runtime/engine/moe_checkpoint.h"
#include "dscpp/runtime/engine/universal_load.h"

namespace dscpp::engine_checkpoint {

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

}  // namespace dscpp::engine_checkpoint

namespace dscpp {

using checkpoint::PyValue;
using engine_checkpoint::need;

void EngineCore::load_moe_relayout(const std::string& dir, const std::string& tag,
                                   const PyValue& saved_model, const std::string& path,
                                   int saved_stage, PyValue& model,
                                   const LoadCheckpointOptions& options,
                                   LoadCheckpointResult& result) {
  const engine_checkpoint::Experts experts = *client_.expert_params;
  const bool here3 = zero_->stage() >= 3;
  const checkpoint::ExpertRelayout relayout(dir, tag, saved_model, path);
  if (saved_stage >= 3 && !here3) {
    // A stage-3 module lacks the trainable parameters: their consolidated fp32 values stand
    // in (load_module casts them), under each of their names (a shared one's aliases too).
    std::map<std::string, std::string> source;
    for (const auto& [alias, name] : shared_params_) source[alias] = name;
    std::set<std::string> trainable;
    for (const auto& p : zero_set_) trainable.insert(p.names->begin(), p.names->end());
    PyValue module = need(model, "module", path);
    for (const auto& [name, p] : named_params_()) {
      auto s = source.find(name);
      const std::string& of = s == source.end() ? name : s->second;
      if (trainable.count(of) && !module.contains(PyValue(name)))
        module.set(PyValue(name), PyValue(relayout.param(of, experts).fp32));
    }
    model.set(PyValue("module"), std::move(module));
  }
  auto whole = [&](bool optimizer_states) {
    auto load = [&](zero::ZeroOptimizer& z, const std::vector<std::string>& names) {
      engine_checkpoint::load_whole_params(
          z, [&](size_t i) { return relayout.param(names.at(i), experts); },
          [&](size_t i) {
            return fmt::format("MoE checkpoint '{}': parameter '{}'", result.path, names[i]);
          },
          optimizer_states);
    };
    for (const auto& p : zero_set_) load(*p.zero, *p.names);
  };
  const bool other_params = load_module(model, path, options, result);
  if (options.load_module_only) {
    if (here3) {
      whole(false);  // at stage 3 the module takes no values
    } else {
      refresh_masters_from_params();
    }
  } else if (other_params) {  // its parameters differ: the module's values stand
    refresh_masters_from_params();
  } else {
    whole(options.load_optimizer_states);
  }
}

}  // namespace dscpp
