// The engine's side of `checkpoint.load_universal`: a universal checkpoint's whole tensors
// (runtime/checkpoint/universal.h, written by tools/to_universal or DeepSpeed's
// ds_to_universal) cut into this rank's ZeRO partition, whatever the stage and number of
// ranks. Internal to runtime/engine (engine_checkpoint_load.cpp).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/runtime/checkpoint/universal.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::engine_checkpoint {

// Reads <tag_dir>/zero/<name>/ for every trainable parameter (names: ZeRO's order) into this
// rank's fp32 master partition and, when load_optimizer_states, every state ZeRO's optimizer
// keeps and its step. Each file holds the whole (logical) tensor: without `tp_parts` it must
// be the model's shape; with them (a tensor-parallel engine: this engine's partition metadata
// by name, tp_rank its model rank) it must be the logical shape, and this rank's shard is cut
// from it (tp_reshape.h). Throws CheckpointError naming the file. No communication.
// The same from whole tensors however found: param(i) gives parameter i's (ZeRO's order), where(i)
// names its source in errors.
void load_whole_params(zero::ZeroOptimizer& zero,
                       const std::function<checkpoint::UniversalParam(size_t)>& param,
                       const std::function<std::string(size_t)>& where, bool load_optimizer_states);

// The partitions entry of a tensor_parallel_info() / dscpp_tensor_parallel dict, by name.
std::map<std::string, checkpoint::ParamPartition> partitions_of(const checkpoint::PyValue& info);

void load_universal_partition(
    zero::ZeroOptimizer& zero, const std::vector<std::string>& names, const std::string& tag_dir,
    bool load_optimizer_states,
    const std::map<std::string, checkpoint::ParamPartition>* tp_parts = nullptr, int tp_rank = 0);

// The experts' own ZeroOptimizer (ep_size > 1; names: its order, each a key of `experts`, this
// rank's expert map) from a universal folder, which holds the one-rank model's experts whole
// (every global expert a local one: clones under deepspeed_experts.<E>, stacked weights
// [E, ...]: checkpoint::one_rank_experts): each local parameter's fp32 weights and, when
// load_optimizer_states, its optimizer states and step, cut per global expert of this
// expert-parallel rank (moe_layout.h's slots, checkpoint::ExpertRelayout). Reads only the folders
// of this rank's experts (a stacked weight's whole). Throws CheckpointError naming the folder.
void load_universal_experts(zero::ZeroOptimizer& zero, const std::vector<std::string>& names,
                            const std::map<std::string, nn::moe::ExpertParam>& experts,
                            const std::string& tag_dir, bool load_optimizer_states);

}  // namespace dscpp::engine_checkpoint
