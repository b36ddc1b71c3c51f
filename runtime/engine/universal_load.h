// The engine's side of the checkpoint's normal form: whole tensors by parameter name (a
// universal checkpoint, runtime/checkpoint/universal.h, written by tools/to_universal or
// DeepSpeed's ds_to_universal; or a ZeRO checkpoint of another layout, consolidated) cut into
// this rank's ZeRO partition, whatever the stage and number of ranks. Internal to
// runtime/engine (engine_checkpoint_load.cpp).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/runtime/checkpoint/universal.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::engine_checkpoint {

// The checkpoint's normal form, as this engine reads it: each trainable parameter whole (its
// logical tensor, every optimizer state, the step) by its one-rank state_dict name. A universal
// folder is one already (zero/<name>/, read as asked); a ZeRO checkpoint of any layout becomes
// one when every rank's files are consolidated (universal_from_zero.h), which reads the whole
// model's state on every rank: the price of loading onto another layout.
struct WholeParams {
  // Parameter `name` whole, checked to be of the logical `shape`; throws CheckpointError
  // naming the checkpoint where it is missing or of another shape.
  std::function<checkpoint::UniversalParam(const std::string& name,
                                           const std::vector<int64_t>& shape)>
      read;
  std::function<std::string(const std::string& name)> where;  // its source, for errors

  static WholeParams universal_folder(const std::string& tag_dir);
  static WholeParams consolidated(std::vector<checkpoint::UniversalParam> params,
                                  const std::string& tag_dir);
};

// From whole tensors however found into this rank's fp32 master partition and, when
// load_optimizer_states, every state ZeRO's optimizer keeps and its step: param(i) gives
// parameter i's (ZeRO's order), where(i) names its source in errors. No communication.
void load_whole_params(zero::ZeroOptimizer& zero,
                       const std::function<checkpoint::UniversalParam(size_t)>& param,
                       const std::function<std::string(size_t)>& where, bool load_optimizer_states);

// The partitions entry of a tensor_parallel_info() / dscpp_tensor_parallel dict, by name.
std::map<std::string, checkpoint::ParamPartition> partitions_of(const checkpoint::PyValue& info);

// Every parameter of `zero` (names: ZeRO's order) from `whole`, as load_whole_params. Without
// `tp_parts` each must be the model's shape; with them (a tensor-parallel engine: this engine's
// partition metadata by name, tp_rank its model rank) the logical shape, and this rank's shard
// is cut from it (tp_reshape.h).
void load_partition_by_name(
    zero::ZeroOptimizer& zero, const std::vector<std::string>& names, const WholeParams& whole,
    bool load_optimizer_states,
    const std::map<std::string, checkpoint::ParamPartition>* tp_parts = nullptr, int tp_rank = 0);

// The experts' own ZeroOptimizer (ep_size > 1; names: its order, each a key of `experts`, this
// rank's expert map) from the normal form, which holds the one-rank model's experts whole
// (every global expert a local one: clones under deepspeed_experts.<E>, stacked weights
// [E, ...]: checkpoint::one_rank_experts): each local parameter's fp32 weights and, when
// load_optimizer_states, its optimizer states and step, cut per global expert of this
// expert-parallel rank (moe_layout.h's slots, checkpoint::ExpertRelayout). Reads only this
// rank's experts (a stacked weight's whole). Throws CheckpointError naming the source.
void load_experts_by_name(zero::ZeroOptimizer& zero, const std::vector<std::string>& names,
                          const std::map<std::string, nn::moe::ExpertParam>& experts,
                          const WholeParams& whole, bool load_optimizer_states);

}  // namespace dscpp::engine_checkpoint
