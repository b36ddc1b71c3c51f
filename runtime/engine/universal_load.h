// The engine's side of `checkpoint.load_universal`: a universal checkpoint's whole tensors
// (runtime/checkpoint/universal.h, written by tools/to_universal or DeepSpeed's
// ds_to_universal) cut into this rank's ZeRO partition, whatever the stage and number of
// ranks. Internal to runtime/engine (engine_checkpoint_load.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dscpp/runtime/checkpoint/universal.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::engine_checkpoint {

// Reads <tag_dir>/zero/<name>/ for every trainable parameter (names: ZeRO's order) into this
// rank's fp32 master partition and, when load_optimizer_states, every state ZeRO's optimizer
// keeps and its step. The checkpoint's partition metadata must describe the whole tensor that
// the model holds (tensor-parallel slicing is not implemented yet). Throws CheckpointError
// naming the file. No communication.
// The same from whole tensors however found: param(i) gives parameter i's (ZeRO's order), where(i)
// names its source in errors.
void load_whole_params(zero::ZeroOptimizer& zero,
                       const std::function<checkpoint::UniversalParam(size_t)>& param,
                       const std::function<std::string(size_t)>& where, bool load_optimizer_states);

void load_universal_partition(zero::ZeroOptimizer& zero, const std::vector<std::string>& names,
                              const std::string& tag_dir, bool load_optimizer_states);

}  // namespace dscpp::engine_checkpoint
