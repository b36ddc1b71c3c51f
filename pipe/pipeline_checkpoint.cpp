// PipelineEngine::save_checkpoint / load_checkpoint: DeepSpeed's pipeline layout
// (runtime/checkpoint/pipe_layout.h) through EngineCore's own save and load, which write the
// model states and ZeRO partitions; this file only names them per stage and adds the layer
// files, written by each stage's first data rank before its model states, which record them.
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
  layout.model_states_path = [stage](const std::string& dir, const std::string& tag) {
    return checkpoint::pipe_model_states_path(dir, tag, stage, 0, 1);
  };
  layout.zero_states_path = [stage](const std::string& dir, const std::string& tag, int dp_rank,
                                    bool bf16) {
    return checkpoint::pipe_zero_states_path(dir, tag, dp_rank, stage, 0, 1, bf16);
  };
  layout.before_model_states = [this](const std::string& dir, const std::string& tag,
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
        const std::string path = checkpoint::layer_states_path(dir, tag, i);
        checkpoint::save_layer_states(state, path);
        files.push_back({i, spec.tied_key.empty() ? spec.name : tied_name[spec.tied_key],
                         checkpoint::layer_file_name(i), checkpoint::file_digest(path)});
      }
    }
    // As DeepSpeed's PipelineEngine: the module lives in the layer files.
    model.set(PyValue("module"), PyValue());
    model.set(PyValue("mp_world_size"), PyValue(module_.num_stages()));
    PyValue dims = PyValue::dict();
    dims.set(PyValue("pp_degree"), PyValue(module_.num_stages()));
    dims.set(PyValue("tp_degree"), PyValue(1));
    model.set(PyValue("checkpoint_parallel_dimensions"), std::move(dims));
    model.set(PyValue("dscpp_pipe"),
              checkpoint::pipe_entry(module_.num_stages(), module_.stage_id(),
                                     module_.data_parallel_size(), files));
  };
  layout.partial_module = true;
  layout.stage = stage;
  layout.stages = module_.num_stages();
  return layout;
}

void PipelineEngine::refuse_tensor_parallel_checkpoint(const char* what) const {
  // The layer files and ZeRO partitions of t model ranks would land on the same names.
  if (module_.model_parallel_size() > 1)
    throw Error(fmt::format(
        "PipelineEngine::{}: a pipeline with tensor parallelism (model axis {}) has no "
        "checkpoint layout yet (layer_XX-model_TT files per model rank); only model 1 saves "
        "and loads",
        what, module_.model_parallel_size()));
}

void PipelineEngine::save_checkpoint(const std::string& save_dir, const std::string& tag,
                                     const PyValue& client_state) {
  core_->check_deferred_error();
  refuse_tensor_parallel_checkpoint("save_checkpoint");
  core_->save_checkpoint(save_dir, tag, client_state);
}

LoadCheckpointResult PipelineEngine::load_checkpoint(const std::string& load_dir,
                                                     const std::string& tag,
                                                     bool load_optimizer_states,
                                                     bool load_lr_scheduler_states,
                                                     bool load_module_only) {
  core_->check_deferred_error();
  refuse_tensor_parallel_checkpoint("load_checkpoint");
  return core_->load_checkpoint(load_dir, tag,
                                {/*load_module_strict=*/true, load_optimizer_states,
                                 load_lr_scheduler_states, load_module_only});
}

}  // namespace dscpp::pipe
