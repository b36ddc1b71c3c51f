// DeepSpeed's pipeline checkpoint layout: see pipe_layout.h.
#include "dscpp/runtime/checkpoint/pipe_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::checkpoint {

namespace fs = std::filesystem;

std::string layer_file_name(int global_layer, int model_rank) {
  if (global_layer < 0)
    throw CheckpointError(fmt::format("pipeline checkpoint: layer index {} < 0", global_layer));
  if (model_rank == kNoModelAxis) return fmt::format("layer_{:02d}-model_states.pt", global_layer);
  if (model_rank < 0)
    throw CheckpointError(fmt::format("pipeline checkpoint: model rank {} < 0", model_rank));
  return fmt::format("layer_{:02d}-model_{:02d}-model_states.pt", global_layer, model_rank);
}

std::string layer_states_path(const std::string& dir, const std::string& tag, int global_layer,
                              int model_rank) {
  return (fs::path(tag_dir(dir, tag)) / layer_file_name(global_layer, model_rank)).string();
}

int pipe_mp_rank(int stage, int model_rank, int model_size) {
  if (model_size < 1 || model_rank < 0 || model_rank >= model_size || stage < 0)
    throw CheckpointError(
        fmt::format("pipeline checkpoint: stage {}, model rank {} of {}: out of range", stage,
                    model_rank, model_size));
  return stage * model_size + model_rank;
}

std::string pipe_model_states_path(const std::string& dir, const std::string& tag, int stage,
                                   int model_rank, int model_size) {
  return (fs::path(tag_dir(dir, tag)) / fmt::format("mp_rank_{:02d}_model_states.pt",
                                                    pipe_mp_rank(stage, model_rank, model_size)))
      .string();
}

std::string pipe_zero_states_path(const std::string& dir, const std::string& tag, int dp_rank,
                                  int stage, int model_rank, int model_size, bool bf16) {
  if (dp_rank < 0)
    throw CheckpointError(fmt::format("pipeline checkpoint: data rank {} < 0", dp_rank));
  return (fs::path(tag_dir(dir, tag)) /
          fmt::format("{}zero_pp_rank_{}_mp_rank_{:02d}_optim_states.pt", bf16 ? "bf16_" : "",
                      dp_rank, pipe_mp_rank(stage, model_rank, model_size)))
      .string();
}

void save_layer_states(const LayerState& state, const std::string& path) {
  PyValue dict = PyValue::ordered_dict();
  for (const auto& [key, tensor] : state) {
    if (dict.contains(PyValue(key)))
      throw CheckpointError(
          fmt::format("pipeline checkpoint '{}': key '{}' twice in one layer", path, key));
    // detach: the file holds values; a tensor that requires grad pickles the same.
    dict.set(PyValue(key), PyValue(tensor.detach()));
  }
  save_torch_file(dict, path);
}

LayerState load_layer_states(const std::string& path) {
  const PyValue root = load_torch_file(path);
  if (!root.is_dict())
    throw CheckpointError(
        fmt::format("pipeline layer file '{}': expected a dict of tensors (a state_dict), found {}",
                    path, root.kind_name()));
  LayerState state;
  for (size_t i = 0; i < root.size(); ++i) {
    const PyValue& key = root.keys()[i];
    const PyValue& value = root.values()[i];
    if (!key.is_string())
      throw CheckpointError(
          fmt::format("pipeline layer file '{}': entry {}: expected a string key, found {}", path,
                      i, key.kind_name()));
    if (!value.is_tensor())
      throw CheckpointError(
          fmt::format("pipeline layer file '{}': '{}': expected a tensor, found {}", path,
                      key.as_string(), value.kind_name()));
    state.emplace_back(key.as_string(), value.as_tensor());
  }
  return state;
}

std::string find_layer_states(const std::string& dir, const std::string& tag, int global_layer,
                              int model_rank, int model_size) {
  if (model_size < 1 || model_rank < 0 || model_rank >= model_size)
    throw CheckpointError(fmt::format("pipeline checkpoint: model rank {} of {}: out of range",
                                      model_rank, model_size));
  const std::string prefix = fmt::format("layer_{:02d}-", global_layer);
  const std::string suffix = "model_states.pt";
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(tag_dir(dir, tag), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() >= prefix.size() + suffix.size() &&
        name.compare(0, prefix.size(), prefix) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(entry.path().string());
  }
  if (ec)
    throw CheckpointError(fmt::format("pipeline checkpoint '{}': cannot list it: {}",
                                      tag_dir(dir, tag), ec.message()));
  std::sort(found.begin(), found.end());
  if (found.empty())
    throw CheckpointError(
        fmt::format("pipeline checkpoint '{}' has no file for layer {} (expected {}*{})",
                    tag_dir(dir, tag), global_layer, prefix, suffix));
  if (static_cast<int>(found.size()) != model_size)
    throw CheckpointError(
        fmt::format("pipeline checkpoint '{}': layer {} was written by {} tensor-parallel ranks, "
                    "loading it on {} is not supported (DeepSpeed merges them for Megatron "
                    "inference only)",
                    tag_dir(dir, tag), global_layer, found.size(), model_size));
  return found[model_rank];
}

}  // namespace dscpp::checkpoint
