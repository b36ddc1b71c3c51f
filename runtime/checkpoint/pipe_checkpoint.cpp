// A pipeline checkpoint read whole: see pipe_checkpoint.h.
#include "dscpp/runtime/checkpoint/pipe_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/moe_pipe_stage.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/py_dict.h"
#include "dscpp/runtime/checkpoint/save_binding.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"

namespace dscpp::checkpoint {

using detail::need;

namespace fs = std::filesystem;

namespace {

// Each layer's names in a stage module held in its model states (a MoE stage's), those under
// "<prefix>." in the module's order; a name no layer claims would be lost: refused.
std::vector<std::vector<std::string>> layer_keys(const PyValue& module,
                                                 const std::vector<PipeLayerFile>& layers,
                                                 const std::string& path) {
  std::vector<std::vector<std::string>> out;
  std::set<std::string> claimed;
  for (const PipeLayerFile& l : layers) {
    if (!l.file.empty())
      throw CheckpointError(fmt::format(
          "'{}' is a MoE stage's (its module in the model states), but lists the layer file '{}'",
          path, l.file));
    std::vector<std::string> names;
    for (const auto& k : module.keys())
      if (k.as_string().rfind(l.prefix + ".", 0) == 0) names.push_back(k.as_string());
    claimed.insert(names.begin(), names.end());
    out.push_back(std::move(names));
  }
  for (const auto& k : module.keys())
    if (!claimed.count(k.as_string()))
      throw CheckpointError(
          fmt::format("'{}': module key '{}' is under none of its layers", path, k.as_string()));
  return out;
}

}  // namespace

PyValue pipe_entry(int stages, int stage, int data_parallel_size,
                   const std::vector<PipeLayerFile>& layers, int model_rank,
                   int model_parallel_size) {
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
  if (model_parallel_size > 1) {
    out.set(PyValue("model_rank"), PyValue(model_rank));
    out.set(PyValue("model_parallel_size"), PyValue(model_parallel_size));
  }
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
                                  int stage, int model_rank, int model_size) {
  for (bool bf16 : {false, true}) {
    std::string p = pipe_zero_states_path(dir, tag, dp_rank, stage, model_rank, model_size, bf16);
    if (fs::is_regular_file(p)) return p;
  }
  throw CheckpointError(fmt::format(
      "pipeline checkpoint '{}' has no ZeRO partition file of stage {}, model rank {}, data "
      "rank {} (expected {} or its bf16_ variant)",
      tag_dir(dir, tag), stage, model_rank, dp_rank,
      pipe_zero_states_path(dir, tag, dp_rank, stage, model_rank, model_size, false)));
}

PipeCheckpoint read_pipe_checkpoint(const std::string& dir, const std::string& tag) {
  PipeCheckpoint ck;
  const std::string first = pipe_model_states_path(dir, tag, 0, 0, 1);  // mp_rank_00 for any t
  if (!fs::is_regular_file(first))
    throw CheckpointError("pipeline checkpoint '" + tag_dir(dir, tag) +
                          "' has no model states of stage 0 (expected " + first + ")");
  PyValue model0 = load_torch_file(first);
  const PyValue& entry0 = need(model0, "dscpp_pipe", first);
  ck.stages = static_cast<int>(need(entry0, "stages", first).as_int());
  ck.data_parallel_size = static_cast<int>(need(entry0, "data_parallel_size", first).as_int());
  if (const PyValue* t = entry0.find(PyValue("model_parallel_size")))
    ck.model_parallel_size = static_cast<int>(t->as_int());
  const int T = ck.model_parallel_size;
  if (ck.stages < 1 || ck.data_parallel_size < 1 || T < 1)
    throw CheckpointError(
        fmt::format("'{}': dscpp_pipe says {} stages x {} data ranks x {} model "
                    "ranks",
                    first, ck.stages, ck.data_parallel_size, T));
  const SaveBinding binding0 = read_binding(model0, first);
  // Every (stage, model rank)'s model states (index k = stage * T + model) and layer list.
  const int files = ck.stages * T;
  std::vector<std::vector<PipeLayerFile>> layers(static_cast<size_t>(files));
  std::map<std::string, ParamPartition> parts;  // split tensors' metadata (T > 1)
  for (int k = 0; k < files; ++k) {
    const int s = k / T, m = k % T;
    const std::string path = pipe_model_states_path(dir, tag, s, m, T);
    if (!fs::is_regular_file(path))
      throw CheckpointError(fmt::format(
          "pipeline checkpoint '{}' of {} stages x {} model ranks has no model states of stage "
          "{}, model rank {} (expected {})",
          tag_dir(dir, tag), ck.stages, T, s, m, path));
    PyValue model = k == 0 ? model0 : load_torch_file(path);
    const PyValue& entry = need(model, "dscpp_pipe", path);
    const SaveBinding b = read_binding(model, path);
    const PyValue* mr = entry.find(PyValue("model_rank"));
    const PyValue* mt = entry.find(PyValue("model_parallel_size"));
    const int64_t got_m = mr ? mr->as_int() : 0, got_t = mt ? mt->as_int() : 1;
    if (need(entry, "stage", path).as_int() != s ||
        need(entry, "stages", path).as_int() != ck.stages || got_m != m || got_t != T)
      throw CheckpointError(fmt::format(
          "'{}' says it is stage {} of {}, model rank {} of {}; expected stage {} of {}, model "
          "rank {} of {}",
          path, need(entry, "stage", path).as_int(), need(entry, "stages", path).as_int(), got_m,
          got_t, s, ck.stages, m, T));
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
      // "": a MoE stage's layer, whose tensors its model states hold (no layer file).
      if (!l.file.empty() && l.file != layer_file_name(l.index, T > 1 ? m : kNoModelAxis))
        throw CheckpointError(fmt::format("'{}' lists layer {} as '{}'", path, l.index, l.file));
      layers[static_cast<size_t>(k)].push_back(std::move(l));
    }
    if (T > 1) {
      const PyValue& pp = need(need(model, "dscpp_tensor_parallel", path), "partitions", path);
      for (size_t i = 0; i < pp.size(); ++i)
        parts.emplace(
            pp.keys()[i].as_string(),
            ParamPartition::from_py(pp.values()[i], path + ": " + pp.keys()[i].as_string()));
    }
    ck.model_paths.push_back(path);
    ck.models.push_back(std::move(model));
  }
  // Each (stage, model rank)'s layer files, checked against their digests, as one shard
  // module under whole-model names; keys[k] keeps each layer's names in file order.
  std::vector<PyValue> shard_module(static_cast<size_t>(files), PyValue::ordered_dict());
  std::vector<std::vector<std::vector<std::string>>> keys(static_cast<size_t>(files));
  // A MoE stage at ep_size > 1 (DeepSpeed's layout: no layer files) as the one-rank model's.
  std::vector<std::unique_ptr<PipeMoeStage>> moe(static_cast<size_t>(files));
  for (int k = 0; k < files; ++k) {
    if (is_pipe_moe_stage(ck.models[static_cast<size_t>(k)])) {
      // With a model axis each (stage, tensor rank) is such a part of its own, mp_rank_<k>
      // (k = stage * T + model, DeepSpeed's checkpoint_mp_rank); its experts are replicas over
      // the tensor ranks (no partition: the merge below takes tensor rank 0's), its dense
      // tensors shards, merged like a layer file's.
      const int s = k / T, m = k % T;
      moe[static_cast<size_t>(k)] = std::make_unique<PipeMoeStage>(
          dir, tag, ck.models[static_cast<size_t>(k)], ck.model_paths[static_cast<size_t>(k)], k,
          [&dir, &tag, s, m, T](int r) { return find_pipe_zero_states(dir, tag, r, s, m, T); });
      shard_module[static_cast<size_t>(k)] = moe[static_cast<size_t>(k)]->module;
      keys[static_cast<size_t>(k)] =
          layer_keys(shard_module[static_cast<size_t>(k)], layers[static_cast<size_t>(k)],
                     ck.model_paths[static_cast<size_t>(k)]);
      continue;
    }
    for (const PipeLayerFile& l : layers[static_cast<size_t>(k)]) {
      const std::string path = (fs::path(tag_dir(dir, tag)) / l.file).string();
      if (!fs::is_regular_file(path))
        throw CheckpointError(
            fmt::format("pipeline checkpoint: layer file '{}' is missing ('{}' lists it)", path,
                        ck.model_paths[static_cast<size_t>(k)]));
      const std::string digest = file_digest(path);
      if (digest != l.digest)
        throw CheckpointError(fmt::format(
            "pipeline checkpoint: layer file '{}' is not the one this save wrote (digest {}, "
            "'{}' records {}): a file of another run?",
            path, digest, ck.model_paths[static_cast<size_t>(k)], l.digest));
      std::vector<std::string> names;
      for (auto& [key, tensor] : load_layer_states(path)) {
        names.push_back(l.prefix + "." + key);
        if (!shard_module[k].contains(PyValue(names.back())))
          shard_module[k].set(PyValue(names.back()), PyValue(tensor));
      }
      keys[static_cast<size_t>(k)].push_back(std::move(names));
    }
  }
  // A tensor's T shards (model ranks of one stage) as the whole tensor: merged where split.
  auto merge = [&](const std::string& name, const std::vector<at::Tensor>& shards) {
    auto it = parts.find(name);
    return it == parts.end() ? shards.at(0) : merge_tp_shards(shards, it->second, name);
  };
  auto shards_of = [&](int s, const std::string& name) {
    std::vector<at::Tensor> out;
    for (int m = 0; m < T; ++m) {
      const PyValue* v = shard_module[static_cast<size_t>(s * T + m)].find(PyValue(name));
      if (!v)
        throw CheckpointError(
            fmt::format("pipeline checkpoint '{}': model rank {} of stage {} "
                        "has no '{}' in its layer files",
                        tag_dir(dir, tag), m, s, name));
      out.push_back(v->as_tensor());
    }
    return out;
  };
  // The module, by global layer index: a tied module's first holder (its owner) wins, so the
  // copies on later stages (their unused, frozen parameters) do not replace its values.
  struct Ref {
    int index, stage;
    size_t pos;
  };
  std::vector<Ref> order;
  for (int s = 0; s < ck.stages; ++s)
    for (size_t i = 0; i < layers[static_cast<size_t>(s * T)].size(); ++i)
      order.push_back({layers[static_cast<size_t>(s * T)][i].index, s, i});
  std::stable_sort(order.begin(), order.end(),
                   [](const Ref& a, const Ref& b) { return a.index < b.index; });
  ck.module = PyValue::ordered_dict();
  for (const Ref& r : order)
    for (const std::string& name : keys[static_cast<size_t>(r.stage * T)][r.pos])
      if (!ck.module.contains(PyValue(name)))
        ck.module.set(PyValue(name), PyValue(merge(name, shards_of(r.stage, name))));
  // Each trainable parameter whole, from the first stage that trains it (a tied weight's
  // copies hold the same values and optimizer state), merged over the model ranks.
  std::set<std::string> seen;
  for (int s = 0; s < ck.stages; ++s) {
    std::vector<std::map<std::string, UniversalParam>> by_rank(static_cast<size_t>(T));
    std::vector<std::string> names;
    for (int m = 0; m < T; ++m) {
      const size_t k = static_cast<size_t>(s * T + m);
      for (auto& p : moe[k]
                         ? std::move(moe[k]->params)
                         : consolidate_all_groups(
                               ck.models[k], ck.model_paths[k], shard_module[k],
                               [&](int r) { return find_pipe_zero_states(dir, tag, r, s, m, T); },
                               k == 0 ? &ck.optimizer_state : nullptr)) {
        if (m == 0) names.push_back(p.name);
        by_rank[static_cast<size_t>(m)][p.name] = std::move(p);
      }
    }
    for (const std::string& name : names) {
      if (!seen.insert(name).second) continue;
      UniversalParam& p0 = by_rank[0].at(name);
      if (T == 1) {
        ck.params.push_back(std::move(p0));
        continue;
      }
      std::vector<const UniversalParam*> of;
      for (int m = 0; m < T; ++m) {
        auto it = by_rank[static_cast<size_t>(m)].find(name);
        if (it == by_rank[static_cast<size_t>(m)].end())
          throw CheckpointError(
              fmt::format("'{}' lists no parameter '{}' (model rank 0 of its "
                          "stage does)",
                          ck.model_paths[static_cast<size_t>(s * T + m)], name));
        of.push_back(&it->second);
      }
      UniversalParam u;
      u.name = name;
      std::vector<at::Tensor> shards;
      for (const auto* p : of) shards.push_back(p->fp32);
      u.fp32 = merge(name, shards);
      for (const auto& [state, value] : p0.states) {
        std::vector<at::Tensor> st;
        for (const auto* p : of) st.push_back(p->states.at(state));
        u.states[state] = merge(name, st);
      }
      u.step = p0.step;
      auto part = parts.find(name);
      u.partition =
          part != parts.end() ? part->second : ParamPartition::whole(u.fp32.sizes().vec());
      ck.params.push_back(std::move(u));
    }
  }
  return ck;
}

}  // namespace dscpp::checkpoint
