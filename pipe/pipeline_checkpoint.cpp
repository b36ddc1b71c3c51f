// PipelineEngine::save_checkpoint / load_checkpoint: DeepSpeed's pipeline layout
// (runtime/checkpoint/pipe_layout.h) through EngineCore's own save and load, which write the
// model states and ZeRO partitions; this file only names them per stage and adds the layer
// files, written by each stage's first data rank before its model states, which record them.
// With a model axis (t > 1) every (stage, model rank) does so under its own names
// (layer_XX-model_TT, mp_rank_<stage*t+model>) and records its partition metadata.
// A stage with expert parallelism (ep_size > 1) writes DeepSpeed's PipelineEngine MoE layout
// (runtime/checkpoint/moe_pipe_stage.h): no layer files, its module (without the experts) in
// its model states, the engine's expert files under its mp_rank (layer_<L>_expert_<E>_mp_rank_
// <stage>, L counted in the stage's module as DeepSpeed's moe_layer_id); its layers are still
// listed (file "") so that a reader finds each layer's names. With a model axis too (pipeline x
// tensor x experts) each (stage, model rank) writes that layout under its own mp_rank
// (stage * t + model, DeepSpeed's checkpoint_mp_rank: layer_<L>_expert_<E>_mp_rank_<that>), its
// module's split tensors recorded in dscpp_tensor_parallel (the experts, replicated over the
// model ranks, are not split).
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
    // Expert parallelism: DeepSpeed's MoE stage keeps its module in the model states.
    const bool moe_stage = core_->expert_zero_optimizer() != nullptr;
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
        const std::string prefix = spec.tied_key.empty() ? spec.name : tied_name[spec.tied_key];
        if (moe_stage) {
          files.push_back({i, prefix, "", ""});
          continue;
        }
        const std::string path = checkpoint::layer_states_path(dir, tag, i, axis);
        checkpoint::save_layer_states(state, path);
        files.push_back(
            {i, prefix, checkpoint::layer_file_name(i, axis), checkpoint::file_digest(path)});
      }
    }
    // As DeepSpeed's PipelineEngine: the module lives in the layer files (a MoE stage's, less
    // its experts, in the model states: to_moe_model_states took those out).
    if (!moe_stage) model.set(PyValue("module"), PyValue());
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
  layout.mp_rank = checkpoint::pipe_mp_rank(stage, m, t);
  return layout;
}

void PipelineEngine::save_checkpoint(const std::string& save_dir, const std::string& tag,
                                     const PyValue& client_state) {
  core_->check_deferred_error();
  core_->save_checkpoint(save_dir, tag, client_state);
}

LoadCheckpointResult PipelineEngine::load_checkpoint(const std::string& load_dir,
                                                     const std::string& tag,
                                                     bool load_optimizer_states,
                                                     bool load_lr_scheduler_states,
                                                     bool load_module_only) {
  core_->check_deferred_error();
  return core_->load_checkpoint(load_dir, tag,
                                {/*load_module_strict=*/true, load_optimizer_states,
                                 load_lr_scheduler_states, load_module_only});
}

}  // namespace dscpp::pipe
