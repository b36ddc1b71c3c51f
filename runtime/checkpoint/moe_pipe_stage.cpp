// A pipeline stage's MoE checkpoint read as the one-rank model's: see moe_pipe_stage.h.
#include "dscpp/runtime/checkpoint/moe_pipe_stage.h"

#include <fmt/format.h>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/moe_relayout.h"

namespace dscpp::checkpoint {

bool is_pipe_moe_stage(const PyValue& model_states) {
  return model_states.is_dict() && model_states.contains(PyValue("num_experts")) &&
         moe_ep_size(model_states) > 1;
}

PipeMoeStage::PipeMoeStage(const std::string& dir, const std::string& tag, const PyValue& model,
                           const std::string& path, int mp_rank,
                           const std::function<std::string(int)>& zero_file) {
  // The stage's expert-parallel groups tile its data ranks, or its files cannot be laid out.
  const PyValue* world = model.find(PyValue("dp_world_size"));
  const int64_t ep = moe_ep_size(model);
  if (!world || world->as_int() % ep != 0)
    throw CheckpointError(fmt::format("'{}': dp_world_size {} is not a multiple of ep_size {}",
                                      path, world ? world->as_int() : 0, ep));
  const auto one = one_rank_experts(experts_of_info(model, path));
  auto files = ExpertFiles::of_model(dir, tag, model, path, mp_rank);
  files.check_model(one);
  const PyValue* dense = model.find(PyValue("module"));
  if (!dense || !dense->is_dict())
    throw CheckpointError("'" + path +
                          "' holds no module: a MoE pipeline stage keeps its module in its "
                          "model states (DeepSpeed's layout)");
  module = module_with_experts(*dense, one, files);
  const ExpertRelayout relayout(dir, tag, model, path, mp_rank, zero_file);
  const PyValue* shapes = model.find(PyValue("param_shapes"));
  if (!shapes || !shapes->is_list() || shapes->size() < 1)
    throw CheckpointError("'" + path + "' has no param_shapes");
  for (size_t g = 0; g + 1 < shapes->size(); ++g)  // the dense groups (the experts' last)
    for (const auto& name : shapes->items()[g].keys())
      params.push_back(relayout.param(name.as_string(), one));
  for (const auto& [name, e] : one) params.push_back(relayout.param(name, one));
}

}  // namespace dscpp::checkpoint
