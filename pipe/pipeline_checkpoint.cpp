// PipelineEngine::save_checkpoint / load_checkpoint: DeepSpeed's pipeline layout
// (runtime/checkpoint/pipe_layout.h) through EngineCore's own save and load, which write the
// model states and ZeRO partitions; this file only names them per stage and adds the layer
// files, written by each stage's first data rank before its model states, which record them.
// With a model axis (t > 1) every (stage, model rank) does so under its own names
// (layer_XX-model_TT, mp_rank_<stage*t+model>) and records its partition metadata.
#include <fmt/format.h>

#include "dscpp/error.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/pipe_checkpoint.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"

namespace dscpp::pipe {

using checkpoint::PyValue;

CheckpointLayout PipelineEngine::checkpoint_layout() {
  CheckpointLayout layout;
  layout.world = module_.world();
  const int stage = module_.stage_id();
  // A model axis (3D): each (stage, model rank) writes its own files, DeepSpeed's names.
  const int t = module_.model_parallel_size(), m = t > 1 ? module_.model_parallel_id() : 0;
  layout.model_states_path = [stage, m, t](const std::string& dir, const std::string& tag) {
    return checkpoint::pipe_model_states_path(dir, tag, stage, m, t);
  };
  layout.zero_states_path = [stage, m, t](const std::string& dir, const std::string& tag,
                                          int dp_rank, bool bf16) {
    return checkpoint::pipe_zero_states_path(dir, tag, dp_rank, stage, m, t, bf16);
  };
  layout.before_model_states = [this, m, t](const std::string& dir, const std::string& tag,
                                            PyValue& model) {
    // One file per layer this rank runs (every chunk), its module's state_dict; a tied module
    // under each of its layers' indices, as DeepSpeed's save_state_dict writes it.
    std::map<std::string, std::string> tied_name;  // key -> its first spec's name
    for (const auto& s : module_.specs())
      if (!s.tied_key.empty() && !tied_name.count(s.tied_key)) tied_name[s.tied_key] = s.name;
    std::vector<checkpoint::PipeLayerFile> files;
    for (int c = 0; c < module_.num_chunks(); ++c) {
      const StageChunk& chunk = module_.chunk(c);
      for (int i = chunk.begin; i < chunk.end; ++i) {
        const auto& spec = module_.specs()[i];
        const auto& layer = chunk.layers.at(i - chunk.begin);
        checkpoint::LayerState state;
        for (const auto& item : layer.module->named_parameters(/*recurse=*/true))
          state.emplace_back(item.key(), item.value());
        for (const auto& item : layer.module->named_buffers(/*recurse=*/true))
          state.emplace_back(item.key(), item.value());
        const int axis = t > 1 ? m : checkpoint::kNoModelAxis;
        const std::string path = checkpoint::layer_states_path(dir, tag, i, axis);
        checkpoint::save_layer_states(state, path);
        files.push_back({i, spec.tied_key.empty() ? spec.name : tied_name[spec.tied_key],
                         checkpoint::layer_file_name(i, axis), checkpoint::file_digest(path)});
      }
    }
    // As DeepSpeed's PipelineEngine: the module lives in the layer files.
    model.set(PyValue("module"), PyValue());
    model.set(PyValue("mp_world_size"), PyValue(module_.num_stages() * t));
    PyValue dims = PyValue::dict();
    dims.set(PyValue("pp_degree"), PyValue(module_.num_stages()));
    dims.set(PyValue("tp_degree"), PyValue(t));
    model.set(PyValue("checkpoint_parallel_dimensions"), std::move(dims));
    model.set(PyValue("dscpp_pipe"),
              checkpoint::pipe_entry(module_.num_stages(), module_.stage_id(),
                                     module_.data_parallel_size(), files, m, t));
    // How each of this stage's tensors is split over the model ranks: the loader merges them.
    if (t > 1) model.set(PyValue("dscpp_tensor_parallel"), core_->tensor_parallel_info());
  };
  layout.partial_module = true;
  layout.stage = stage;
  layout.stages = module_.num_stages();
  return layout;
}

namespace {

// The engine's MoE layout (layer_L_expert_E files, moe_checkpoint.h) numbers a module's MoE
// layers from 0, which on a pipeline would be each stage's own count: refused until the
// stages number them together (a pipeline at ep_size 1 keeps its experts in the layer files).
void refuse_expert_parallel(EngineCore& core, const char* what) {
  if (core.expert_zero_optimizer())
    throw Error(fmt::format(
        "PipelineEngine::{}: expert parallelism (ep_size > 1) on a pipeline has no checkpoints "
        "yet (DeepSpeed's layer_L_expert_E files need the MoE layers numbered over the stages)",
        what));
}

}  // namespace

void PipelineEngine::save_checkpoint(const std::string& save_dir, const std::string& tag,
                                     const PyValue& client_state) {
  core_->check_deferred_error();
  refuse_expert_parallel(*core_, "save_checkpoint");
  core_->save_checkpoint(save_dir, tag, client_state);
}

LoadCheckpointResult PipelineEngine::load_checkpoint(const std::string& load_dir,
                                                     const std::string& tag,
                                                     bool load_optimizer_states,
                                                     bool load_lr_scheduler_states,
                                                     bool load_module_only) {
  core_->check_deferred_error();
  refuse_expert_parallel(*core_, "load_checkpoint");
  return core_->load_checkpoint(load_dir, tag,
                                {/*load_module_strict=*/true, load_optimizer_states,
                                 load_lr_scheduler_states, load_module_only});
}

}  // namespace dscpp::pipe
