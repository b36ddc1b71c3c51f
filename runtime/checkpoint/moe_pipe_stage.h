// A pipeline stage's part of a MoE checkpoint at ep_size > 1, read as the one-rank model's.
// DeepSpeed's PipelineEngine with MoE layers (deepspeed/runtime/engine.py, _save_moe_checkpoint,
// 0.19.8) writes no layer_XX-model_states.pt files for such a stage: its model states
// mp_rank_<stage> hold the stage's module without the expert tensors (DeepSpeedEngine's
// module_state_dict, not the pipeline's), `num_experts` one count per MoE layer of the stage,
// and the experts lie in layer_<L>_expert_<E>_mp_rank_<stage>_model_states.pt, L counting the
// MoE layers of the stage's own module from 0 (its moe_layer_id), E the global expert; at
// ZeRO 0 expp_rank_<R>_mp_rank_<stage>_optim_states.pt. The files of one stage are the plain
// engine's MoE layout (moe_layout.h, moe_relayout.h) under the stage's mp_rank and ZeRO file
// names, and are read with the same code. A tensor-parallel MoE checkpoint's tensor rank XX
// (mp_rank_XX, its expert files and ZeRO files: engine_checkpoint_tp.cpp, fp32_state.cpp) is
// read the same way, at any ep_size. Reads files only; CheckpointError naming the file.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/checkpoint/universal.h"

namespace dscpp::checkpoint {

// Whether a stage's model states are such a stage's (num_experts, dscpp_moe at ep_size > 1).
bool is_pipe_moe_stage(const PyValue& model_states);

struct PipeMoeStage {
  // model: the stage's model states, read from `path`; mp_rank: its files' mp_rank_XX;
  // zero_file(r): its data rank r's ZeRO file.
  PipeMoeStage(const std::string& dir, const std::string& tag, const PyValue& model,
               const std::string& path, int mp_rank,
               const std::function<std::string(int)>& zero_file);
  PyValue module;  // the stage's state dict with every global expert, one-rank names (clones
                   // deepspeed_experts.<E>, stacked weights [E, ...])
  std::vector<UniversalParam> params;  // its trainable parameters whole, the same names: the
                                       // dense ones in param_shapes' order, then the experts'
};

}  // namespace dscpp::checkpoint
