// A pipeline checkpoint read whole: see pipe_checkpoint.h.
#include "dscpp/runtime/checkpoint/pipe_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/save_binding.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"

namespace dscpp::checkpoint {

namespace fs = std::filesystem;

namespace {

const PyValue& need(const PyValue& dict, const char* key, const std::string& path) {
  const PyValue* v = dict.is_dict() ? dict.find(PyValue(key)) : nullptr;
  if (!v) throw CheckpointError("'" + path + "' has no '" + key + "' entry");
  return *v;
}

}  // namespace

PyValue pipe_entry(int stages, int stage, int data_parallel_size,
                   const std::vector<PipeLayerFile>& layers) {
  PyValue list = PyValue::list();
  for (const auto& l : layers) {
    PyValue e = PyValue::dict();
    e.set(PyValue("index"), PyValue(l.index));
    e.set(PyValue("prefix"), PyValue(l.prefix));
    e.set(PyValue("file"), PyValue(l.file));
    e.set(PyValue("digest"), PyValue(l.digest));
    list.append(std::move(e));
  }
  PyValue out = PyValue::dict();
  out.set(PyValue("stages"), PyValue(stages));
  out.set(PyValue("stage"), PyValue(stage));
  out.set(PyValue("data_parallel_size"), PyValue(data_parallel_size));
  out.set(PyValue("layers"), std::move(list));
  return out;
}

bool is_pipe_checkpoint(const PyValue& model_states) {
  return model_states.is_dict() && model_states.contains(PyValue("dscpp_pipe"));
}

std::string file_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot open '" + path + "'");
  uint64_t h = 1469598103934665603ull;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h ^= static_cast<unsigned char>(buf[static_cast<size_t>(i)]);
      h *= 1099511628211ull;
    }
  }
  if (in.bad()) throw CheckpointError("cannot read '" + path + "'");
  return fmt::format("{:016x}", h);
}

std::string find_pipe_zero_states(const std::string& dir, const std::string& tag, int dp_rank,
                                  int stage) {
  for (bool bf16 : {false, true}) {
    std::string p = pipe_zero_states_path(dir, tag, dp_rank, stage, 0, 1, bf16);
    if (fs::is_regular_file(p)) return p;
  }
  throw CheckpointError(fmt::format(
      "pipeline checkpoint '{}' has no ZeRO partition file of stage {}, data rank {} (expected "
      "{} or its bf16_ variant)",
      tag_dir(dir, tag), stage, dp_rank,
      pipe_zero_states_path(dir, tag, dp_rank, stage, 0, 1, false)));
}

PipeCheckpoint read_pipe_checkpoint(const std::string& dir, const std::string& tag) {
  PipeCheckpoint ck;
  const std::string first = pipe_model_states_path(dir, tag, 0, 0, 1);
  if (!fs::is_regular_file(first))
    throw CheckpointError("pipeline checkpoint '" + tag_dir(dir, tag) +
                          "' has no model states of stage 0 (expected " + first + ")");
  PyValue model0 = load_torch_file(first);
  const PyValue& entry0 = need(model0, "dscpp_pipe", first);
  ck.stages = static_cast<int>(need(entry0, "stages", first).as_int());
  ck.data_parallel_size = static_cast<int>(need(entry0, "data_parallel_size", first).as_int());
  if (ck.stages < 1 || ck.data_parallel_size < 1)
    throw CheckpointError(fmt::format("'{}': dscpp_pipe says {} stages x {} data ranks", first,
                                      ck.stages, ck.data_parallel_size));
  const SaveBinding binding0 = read_binding(model0, first);
  std::vector<PipeLayerFile> layers;
  std::vector<int> layer_stage;
  for (int s = 0; s < ck.stages; ++s) {
    const std::string path = pipe_model_states_path(dir, tag, s, 0, 1);
    if (!fs::is_regular_file(path))
      throw CheckpointError(fmt::format(
          "pipeline checkpoint '{}' of {} stages has no model states of stage {} (expected {})",
          tag_dir(dir, tag), ck.stages, s, path));
    PyValue model = s == 0 ? model0 : load_torch_file(path);
    const PyValue& entry = need(model, "dscpp_pipe", path);
    const SaveBinding b = read_binding(model, path);
    if (need(entry, "stage", path).as_int() != s ||
        need(entry, "stages", path).as_int() != ck.stages)
      throw CheckpointError(fmt::format("'{}' says it is stage {} of {}, expected stage {} of {}",
                                        path, need(entry, "stage", path).as_int(),
                                        need(entry, "stages", path).as_int(), s, ck.stages));
    if (b.save_id != binding0.save_id || b.global_steps != binding0.global_steps)
      throw CheckpointError(fmt::format(
          "'{}' ({}, step {}) was not written by the save of '{}' ({}, step {}): files of "
          "another run",
          path, b.save_id.empty() ? "no save id" : "save " + b.save_id, b.global_steps, first,
          binding0.save_id.empty() ? "no save id" : "save " + binding0.save_id,
          binding0.global_steps));
    for (const auto& e : need(entry, "layers", path).items()) {
      PipeLayerFile l;
      l.index = static_cast<int>(need(e, "index", path).as_int());
      l.prefix = need(e, "prefix", path).as_string();
      l.file = need(e, "file", path).as_string();
      l.digest = need(e, "digest", path).as_string();
      if (l.file != layer_file_name(l.index))
        throw CheckpointError(fmt::format("'{}' lists layer {} as '{}'", path, l.index, l.file));
      layers.push_back(std::move(l));
      layer_stage.push_back(s);
    }
    ck.model_paths.push_back(path);
    ck.models.push_back(std::move(model));
  }
  // The module, by global layer index: a tied module's first holder (its owner) wins, so the
  // copies on later stages (their unused, frozen parameters) do not replace its values.
  std::vector<size_t> order(layers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return layers[a].index < layers[b].index; });
  ck.module = PyValue::ordered_dict();
  for (size_t i : order) {
    const PipeLayerFile& l = layers[i];
    const std::string path = (fs::path(tag_dir(dir, tag)) / l.file).string();
    if (!fs::is_regular_file(path))
      throw CheckpointError(
          fmt::format("pipeline checkpoint: layer file '{}' is missing ('{}' "
                      "lists it)",
                      path, ck.model_paths[layer_stage[i]]));
    const std::string digest = file_digest(path);
    if (digest != l.digest)
      throw CheckpointError(fmt::format(
          "pipeline checkpoint: layer file '{}' is not the one this save wrote (digest {}, '{}' "
          "records {}): a file of another run?",
          path, digest, ck.model_paths[layer_stage[i]], l.digest));
    for (auto& [key, tensor] : load_layer_states(path)) {
      const std::string name = l.prefix + "." + key;
      if (!ck.module.contains(PyValue(name))) ck.module.set(PyValue(name), PyValue(tensor));
    }
  }
  // Each trainable parameter whole, from the first stage that trains it (a tied weight's
  // copies hold the same values and optimizer state).
  std::set<std::string> seen;
  for (int s = 0; s < ck.stages; ++s) {
    auto params = consolidate_params(ck.models[s], ck.model_paths[s], ck.module,
                                     [&](int r) { return find_pipe_zero_states(dir, tag, r, s); });
    for (auto& p : params)
      if (seen.insert(p.name).second) ck.params.push_back(std::move(p));
  }
  return ck;
}

}  // namespace dscpp::checkpoint
