// DeepSpeed's universal checkpoint layout (deepspeed/checkpoint/ds_to_universal.py and
// universal_checkpoint.py), which DeepSpeed's engine loads with `checkpoint.load_universal`
// onto any number of data-parallel ranks and any ZeRO stage:
//   <dir>/latest_universal                          names the tag, as `latest` does
//   <dir>/<tag>/mp_rank_00_model_states.pt          the model states (counters, schedule, ...)
//   <dir>/<tag>/zero/optimizer_state.pt             the optimizer's settings (param_groups,
//                                                   clip_grad, ds_version, ...), no tensors
//   <dir>/<tag>/zero/<param>/fp32.pt                {"param": the whole fp32 tensor, "cat_dim": 0}
//   <dir>/<tag>/zero/<param>/<state>.pt             the same for each optimizer state
//                                                   (exp_avg, exp_avg_sq, ...)
//   <dir>/<tag>/zero/<param>/step.pt                the optimizer's step (a tensor or an int)
// <param> is the parameter's state_dict name. Every tensor is whole (the logical tensor), so a
// universal checkpoint does not depend on how it was partitioned when saved.
//
// How a tensor is cut across tensor-parallel ranks is written beside it, under keys DeepSpeed
// does not read (dscpp_partition), with the names of DeepSpeed's AutoTP metadata
// (partition_dim, partition_sizes, sub_param_sizes, replicated). Today every parameter is
// whole on every rank (replicated); a tensor-parallel layer fills the other fields.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::checkpoint {

inline constexpr const char* kLatestUniversal = "latest_universal";
// DeepSpeed's UNIVERSAL_CHECKPOINT_VERSION_VALUE: the metadata version we write.
inline constexpr double kUniversalVersion = 0.4;

// How the logical tensor is split across the tp_degree ranks of a tensor-parallel group.
struct ParamPartition {
  std::vector<int64_t> logical_shape;  // the whole tensor's shape
  int64_t tp_degree = 1;
  std::optional<int64_t> partition_dim;  // none: every rank holds it whole (replicated)
  std::vector<int64_t> partition_sizes;  // each rank's width along partition_dim; empty: even
  std::vector<int64_t> sub_param_sizes;  // fused tensors (QKV): each part's width, split alone

  static ParamPartition whole(std::vector<int64_t> shape);
  PyValue to_py() const;
  // Throws CheckpointError naming `where` on a malformed entry.
  static ParamPartition from_py(const PyValue& v, const std::string& where);
};

// One parameter of a universal checkpoint: its whole fp32 value, each optimizer state, step.
struct UniversalParam {
  std::string name;
  ParamPartition partition;
  at::Tensor fp32;
  std::map<std::string, at::Tensor> states;  // exp_avg, exp_avg_sq, ...
  PyValue step;                              // None when the file has no step.pt
};

struct UniversalCheckpoint {
  PyValue model;            // the model-states dict
  PyValue optimizer_state;  // zero/optimizer_state.pt
  std::vector<UniversalParam> params;
};

std::string universal_param_dir(const std::string& tag_dir, const std::string& name);

// Writes `ck` into <dir>/<tag>/ and then <dir>/latest_universal. Every file atomically.
void write_universal(const UniversalCheckpoint& ck, const std::string& dir, const std::string& tag);

// Reads zero/<name>/ of a universal tag folder (written by us or by ds_to_universal): fp32.pt
// and every other <state>.pt; checks each tensor against `shape` (the logical shape).
UniversalParam read_universal_param(const std::string& tag_dir, const std::string& name,
                                    const std::vector<int64_t>& shape);

}  // namespace dscpp::checkpoint
