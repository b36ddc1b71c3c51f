// The engine's side of DeepSpeed's MoE checkpoint layout (runtime/checkpoint/moe_layout.h):
// what save_checkpoint adds and removes when the module has expert parameters, and the view of
// a MoE checkpoint that load_checkpoint reads (the module with this rank's local experts; at
// another expert-parallel degree or ZeRO stage the checkpoint loads through its normal form,
// universal_load.h, which cuts each expert per global expert). Internal to runtime/engine
// (engine_checkpoint_save.cpp, engine_checkpoint_load.cpp); no communication.
#pragma once

#include <map>
#include <string>

#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace torch::nn {
class Module;
}

namespace dscpp::engine_checkpoint {

using Experts = std::map<std::string, nn::moe::ExpertParam>;

// DeepSpeed's expert-data-parallel rank of data rank `rank` (its ep groups are consecutive
// runs of ep_size data ranks: comm/expert_groups.h); rank 0 of each ep rank writes its experts.
inline int expert_data_rank(int rank, int64_t ep_size) {
  return static_cast<int>(rank / ep_size);
}

// Makes the model-states dict DeepSpeed's MoE one: `module` without the expert tensors,
// `num_experts` (per MoE layer), `ds_autoep_layers` None, and ours `dscpp_moe`.
void to_moe_model_states(checkpoint::PyValue& model, const Experts& experts);

// The view of a MoE checkpoint's model states that the dense loader reads: `module` with this
// rank's local expert tensors (from the expert files, global ids renamed to local). Refuses a
// checkpoint whose MoE layers or expert counts differ, a missing expert file, a dense
// checkpoint for a MoE model and a MoE checkpoint for a dense one, naming the files.
checkpoint::PyValue moe_model_view(const std::string& dir, const std::string& tag,
                                   const checkpoint::PyValue& model, const std::string& path,
                                   const Experts& experts);

}  // namespace dscpp::engine_checkpoint
