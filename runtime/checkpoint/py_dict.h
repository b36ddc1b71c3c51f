// Internal to runtime/checkpoint and the engine's checkpoint code (runtime/engine): reading an
// entry of a loaded file's PyValue dict, with an error that names the file (or the place in it)
// and the missing key, so that a file of the wrong kind or version is refused by name instead
// of failing deep inside a reader.
#pragma once

#include <string>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::checkpoint::detail {

// dict[key]; throws CheckpointError naming `path` when dict is not a dict or has no such key.
inline const PyValue& need(const PyValue& dict, const char* key, const std::string& path) {
  if (!dict.is_dict()) throw CheckpointError("'" + path + "' does not hold a dict where expected");
  const PyValue* v = dict.find(PyValue(key));
  if (!v) throw CheckpointError("'" + path + "' has no '" + key + "' entry");
  return *v;
}

}  // namespace dscpp::checkpoint::detail

namespace dscpp::checkpoint {

// Whether parameter group g of a ZeRO file's base optimizer state is DeepSpeed's Muon half (its
// param_groups entry says "use_muon": True).
inline bool is_muon_group(const PyValue& base_optimizer_state, size_t g) {
  const PyValue* groups =
      base_optimizer_state.is_dict() ? base_optimizer_state.find(PyValue("param_groups")) : nullptr;
  if (!groups || !groups->is_list() || groups->size() <= g) return false;
  const PyValue& group = groups->items()[g];
  const PyValue* flag = group.is_dict() ? group.find(PyValue("use_muon")) : nullptr;
  return flag && flag->is_bool() && flag->as_bool();
}

}  // namespace dscpp::checkpoint
