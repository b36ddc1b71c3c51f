// The engine's side of DeepSpeed's MoE checkpoint layout: see moe_checkpoint.h.
#include "dscpp/runtime/engine/moe_checkpoint.h"

#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"

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
