// What binds a tag's files together: see save_binding.h.
#include "dscpp/runtime/checkpoint/save_binding.h"

#include <fmt/format.h>

#include <random>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"

namespace dscpp::checkpoint {

namespace {

int64_t int_key(const PyValue& file, const char* key, const std::string& path) {
  const PyValue* v = file.find(PyValue(key));
  if (!v) return -1;
  if (!v->is_int())
    throw CheckpointError(
        fmt::format("'{}': {} is a {}, expected an int", path, key, v->kind_name()));
  return v->as_int();
}

std::string describe(const SaveBinding& b) {
  return b.save_id.empty() ? "no save id (not written by dscpp)" : "save " + b.save_id;
}

}  // namespace

std::string new_save_id() {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("{:016x}", id);
}

void write_binding(PyValue& file, const SaveBinding& b) {
  file.set(PyValue("dscpp_save_id"), PyValue(b.save_id));
  file.set(PyValue("dscpp_rank"), PyValue(b.rank));
  file.set(PyValue("dscpp_world_size"), PyValue(b.world_size));
  file.set(PyValue("dscpp_global_steps"), PyValue(b.global_steps));
}

SaveBinding read_binding(const PyValue& file, const std::string& path) {
  if (!file.is_dict()) throw CheckpointError("'" + path + "' does not hold a dict");
  SaveBinding b;
  if (const PyValue* id = file.find(PyValue("dscpp_save_id"))) {
    if (!id->is_string() || id->as_string().empty())
      throw CheckpointError("'" + path + "': dscpp_save_id is not a non-empty str");
    b.save_id = id->as_string();
  }
  b.rank = int_key(file, "dscpp_rank", path);
  b.world_size = int_key(file, "dscpp_world_size", path);
  b.global_steps = int_key(file, "dscpp_global_steps", path);
  if (b.world_size < 0) b.world_size = int_key(file, "dp_world_size", path);
  if (b.global_steps < 0) b.global_steps = int_key(file, "global_steps", path);
  return b;
}

void check_partition_binding(const SaveBinding& model, const std::string& model_path,
                             const SaveBinding& part, const std::string& part_path, int rank) {
  if (model.save_id.empty() && part.save_id.empty()) return;  // DeepSpeed's: its own checks
  if (part.rank >= 0 && part.rank != rank)
    throw CheckpointError(fmt::format(
        "'{}' holds the partition of rank {} (dscpp_rank), but its name says rank {}: the "
        "tag's partition files were copied or swapped",
        part_path, part.rank, rank));
  if (part.save_id != model.save_id || part.global_steps != model.global_steps)
    throw CheckpointError(fmt::format(
        "'{}' ({}, step {}) and '{}' ({}, step {}) were not written by the same save: the "
        "tag mixes files of different checkpoints",
        part_path, describe(part), part.global_steps, model_path, describe(model),
        model.global_steps));
  if (part.world_size != model.world_size)
    throw CheckpointError(fmt::format("'{}' was written for {} ranks, '{}' for {}", part_path,
                                      part.world_size, model_path, model.world_size));
}

}  // namespace dscpp::checkpoint
