// Our ZeRO checkpoints (stages 0-3, any number of data ranks, runtime/checkpoint/ds_layout.h)
// as universal checkpoints (universal.h): what DeepSpeed's ds_to_universal does for its own,
// which it cannot do for ours (it needs pickled DeepSpeed objects, param_slice_mappings, that
// torch.load(weights_only=True) refuses and that we do not write). Reads files only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dscpp/runtime/checkpoint/universal.h"

namespace dscpp::checkpoint {

// tag "": the one <dir>/latest names. Each parameter's fp32 master weights and optimizer
// states are consolidated from every rank's partition; the model states are the checkpoint's
// (rank 0's at stage 3, its module then filled with the consolidated weights), with
// universal_checkpoint_info added. A tensor-parallel checkpoint of the plain engine
// (dscpp_tensor_parallel in mp_rank_00) gives whole tensors, merged over its tensor ranks, each
// with its dscpp_partition (how it was cut); a pipeline or 3D checkpoint (pipe_checkpoint.h)
// gives the one-rank model's parameters, merged over stages and model ranks, the same way; a MoE
// checkpoint (num_experts; any ep_size) gives the one-rank model's too, every global expert a
// local one under its whole-model name, without num_experts / dscpp_moe in the model states.
// Throws CheckpointError naming the file.
// The trainable parameters of one model-states file `model` (read from `path`), in its
// param_shapes' order, each whole: the fp32 weights and optimizer states gathered from its ZeRO
// partition files (zero_file(r): data rank r's, r < dp_world_size), or at stage 0 from its
// optimizer state (weights: dscpp_fp32_params, else module[name]). optimizer_state, when given,
// receives the optimizer's settings (what zero/optimizer_state.pt holds).
//
// `which` picks one parameter group of a checkpoint that has several (a MoE one saved at
// ep_size > 1: the dense groups over the data ranks, one or, with Muon, its two halves, then the
// last, each expert-parallel rank's experts over its expert-data group; moe_relayout.h): its
// param_shapes entry, its entry in the ZeRO files' group lists and base state, its partitions
// (partition k in zero_file(rank_of(k))'s file), and at stage 0 the optimizer state dict holding it
// (its entries follow the earlier groups' parameters).
struct ZeroGroup {
  size_t group = 0;
  int partitions = 0;                         // 0: the model's dp_world_size
  std::function<int(int)> rank_of;            // null: partition k is data rank k's file
  const PyValue* stage0_optimizer = nullptr;  // null: the model's `optimizer`
};
std::vector<UniversalParam> consolidate_params(const PyValue& model, const std::string& path,
                                               const PyValue& module,
                                               const std::function<std::string(int)>& zero_file,
                                               PyValue* optimizer_state = nullptr,
                                               const ZeroGroup& which = {});
// Every group of a checkpoint that is not a MoE one at ep_size > 1 (DeepSpeed's Muon saves its
// Muon half and its Adam half as two), one after the other; the settings from the first.
std::vector<UniversalParam> consolidate_all_groups(const PyValue& model, const std::string& path,
                                                   const PyValue& module,
                                                   const std::function<std::string(int)>& zero_file,
                                                   PyValue* optimizer_state = nullptr);
// The number of parameter groups param_shapes lists (two or more for a MoE checkpoint at
// ep_size > 1, the experts' last; else one or more), or CheckpointError naming the file.
size_t param_groups_of(const PyValue& model, const std::string& path);

UniversalCheckpoint universal_from_zero_checkpoint(const std::string& dir,
                                                   const std::string& tag = "");

}  // namespace dscpp::checkpoint
