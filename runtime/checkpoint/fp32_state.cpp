// Consolidated fp32 weights from a checkpoint: see fp32_state.h.
#include "dscpp/runtime/checkpoint/fp32_state.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <filesystem>
#include <functional>
#include <map>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/ds_partition.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/moe_relayout.h"
#include "dscpp/runtime/checkpoint/pipe_checkpoint.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/py_dict.h"
#include "dscpp/runtime/checkpoint/save_binding.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"

namespace dscpp::checkpoint {

using detail::need;

namespace {

// The state dict of one model-states file of a non-pipeline checkpoint (zero_file(r): its data
// rank r's partition file).
PyValue zero_state_dict(const std::string& dir, const std::string& tag, const PyValue& model,
                        const std::string& path, const std::function<std::string(int)>& zero_file);

// The state dict of one model-states file (a MoE one as the one-rank model names it, every
// global expert a local one, from its expert files of `mp_rank`).
PyValue model_file_state_dict(const std::string& dir, const std::string& tag, PyValue model,
                              const std::string& path, int mp_rank,
                              const std::function<std::string(int)>& zero_file) {
  if (model.find(PyValue("num_experts")) && moe_ep_size(model) > 1) {
    // MoE at ep_size > 1 (moe_relayout.h): the dense group over the data ranks, each
    // expert-parallel rank's experts over its expert-data ranks, as the one-rank model names
    // them (every global expert a local one).
    const ExpertRelayout relayout(dir, tag, model, path, mp_rank, zero_file);
    const auto one = one_rank_experts(experts_of_info(model, path));
    ExpertFiles::of_model(dir, tag, model, path, mp_rank).check_model(one);
    PyValue out = PyValue::ordered_dict();
    const PyValue& module = need(model, "module", path);
    // Stage 3's module holds no partitioned parameter: the dense ones come first, in
    // param_shapes' order (as zero_state_dict gives them).
    // (the dense groups: one, or Muon's two halves; the experts' is the last)
    const PyValue& groups = need(model, "param_shapes", path);
    for (size_t g = 0; g + 1 < groups.size(); ++g)
      for (const auto& k : groups.items()[g].keys())
        if (!module.contains(k)) out.set(k, PyValue(relayout.param(k.as_string(), {}).fp32));
    for (size_t i = 0; i < module.size(); ++i) {
      const std::string& name = module.keys()[i].as_string();
      if (relayout.has(name)) {
        out.set(PyValue(name), PyValue(relayout.param(name, {}).fp32));
      } else if (module.values()[i].is_tensor()) {
        const at::Tensor& t = module.values()[i].as_tensor();
        out.set(PyValue(name), PyValue(t.is_floating_point() ? t.to(at::kFloat) : t));
      }
    }
    for (const auto& [name, e] : one)
      out.set(PyValue(name), PyValue(relayout.param(name, one).fp32));
    if (const PyValue* shared = model.find(PyValue("shared_params")); shared && shared->is_dict())
      for (size_t i = 0; i < shared->size(); ++i)
        if (const PyValue* src = out.find(shared->values()[i])) out.set(shared->keys()[i], *src);
    return out;
  }
  if (model.find(PyValue("num_experts"))) {
    // MoE (moe_layout.h): the one-rank model's module, every global expert a local one.
    auto files = ExpertFiles::of_model(dir, tag, model, path, mp_rank);
    const auto one = one_rank_experts(experts_of_info(model, path));
    files.check_model(one);
    model.set(PyValue("module"), module_with_experts(need(model, "module", path), one, files));
  }
  return zero_state_dict(dir, tag, model, path, zero_file);
}

// A tensor-parallel checkpoint of the plain engine (dscpp_tensor_parallel in mp_rank_00): each
// tensor rank's state dict (a MoE one's with its experts: replicated over the tensor ranks), each
// split tensor merged over the ranks (tp_reshape.h).
PyValue tensor_parallel_state_dict(const std::string& dir, const std::string& tag,
                                   const PyValue& model0, const std::string& path0) {
  const PyValue& info = need(model0, "dscpp_tensor_parallel", path0);
  const int t = static_cast<int>(need(info, "tp_degree", path0).as_int());
  std::map<std::string, ParamPartition> parts;
  const PyValue& pp = need(info, "partitions", path0);
  for (size_t i = 0; i < pp.size(); ++i)
    parts.emplace(pp.keys()[i].as_string(),
                  ParamPartition::from_py(pp.values()[i], path0 + ": " + pp.keys()[i].as_string()));
  std::vector<PyValue> sds;
  for (int r = 0; r < t; ++r) {
    const std::string path = pipe_model_states_path(dir, tag, 0, r, t);
    const PyValue model = r == 0 ? model0 : load_torch_file(path);
    const SaveBinding b0 = read_binding(model0, path0), b = read_binding(model, path);
    if (b.save_id != b0.save_id || b.global_steps != b0.global_steps)
      throw CheckpointError("'" + path + "' was not written by the save of '" + path0 +
                            "': files of another run");
    sds.push_back(model_file_state_dict(dir, tag, model, path, r, [&](int dp) {
      for (bool bf16 : {false, true}) {
        const std::string z = pipe_zero_states_path(dir, tag, dp, 0, r, t, bf16);
        if (std::filesystem::is_regular_file(z)) return z;
      }
      throw CheckpointError("'" + tag_dir(dir, tag) +
                            "' has no ZeRO partition file of tensor rank " + std::to_string(r) +
                            ", data rank " + std::to_string(dp) + " (expected " +
                            pipe_zero_states_path(dir, tag, dp, 0, r, t, false) + ")");
    }));
  }
  PyValue out = PyValue::ordered_dict();
  for (size_t i = 0; i < sds[0].size(); ++i) {
    const std::string name = sds[0].keys()[i].as_string();
    auto it = parts.find(name);
    if (it == parts.end() || !it->second.partition_dim) {
      out.set(sds[0].keys()[i], sds[0].values()[i]);
      continue;
    }
    std::vector<at::Tensor> shards;
    for (int r = 0; r < t; ++r) {
      const PyValue* v = sds[static_cast<size_t>(r)].find(PyValue(name));
      if (!v)
        throw CheckpointError("tensor rank " + std::to_string(r) + " of '" + tag_dir(dir, tag) +
                              "' has no '" + name + "'");
      shards.push_back(v->as_tensor());
    }
    out.set(sds[0].keys()[i], PyValue(merge_tp_shards(shards, it->second, name)));
  }
  return out;
}

}  // namespace

PyValue get_fp32_state_dict_from_zero_checkpoint(const std::string& dir,
                                                 const std::string& tag_in) {
  std::string tag = tag_in;
  const std::string path = resolve_model_states(dir, tag);
  PyValue model = load_torch_file(path);
  if (is_pipe_checkpoint(model)) {
    // The layer files give the whole module; the trainable parameters' fp32 values come from
    // their stages' partitions (or, at stage 0, are the layer files' own).
    const PipeCheckpoint ck = read_pipe_checkpoint(dir, tag);
    std::map<std::string, at::Tensor> trained;
    for (const auto& p : ck.params) trained[p.name] = p.fp32;
    PyValue out = PyValue::ordered_dict();
    for (size_t i = 0; i < ck.module.size(); ++i) {
      const std::string& name = ck.module.keys()[i].as_string();
      auto it = trained.find(name);
      const at::Tensor& t = it != trained.end() ? it->second : ck.module.values()[i].as_tensor();
      out.set(PyValue(name), PyValue(t.is_floating_point() ? t.to(at::kFloat) : t));
    }
    return out;
  }
  if (model.find(PyValue("dscpp_tensor_parallel")))
    return tensor_parallel_state_dict(dir, tag, model, path);
  return model_file_state_dict(dir, tag, model, path, 0,
                               [&](int r) { return find_zero_states(dir, tag, r); });
}

namespace {

PyValue zero_state_dict(const std::string& dir, const std::string& tag, const PyValue& model,
                        const std::string& path, const std::function<std::string(int)>& zero_file) {
  const PyValue& module = need(model, "module", path);

  // The trainable parameters' fp32 values, by name.
  std::map<std::string, at::Tensor> fp32;
  const PyValue& shapes_v = need(model, "param_shapes", path);
  const PyValue& optimizer = need(model, "optimizer", path);
  if (!optimizer.is_none()) {
    // Stage 0: the module holds the weights; 16-bit ones have their fp32 copy beside the
    // optimizer state (ours), in param_shapes' order.
    if (const PyValue* list = optimizer.find(PyValue("dscpp_fp32_params"))) {
      if (shapes_v.is_none() || shapes_v.size() != 1 || shapes_v.items()[0].size() != list->size())
        throw CheckpointError("'" + path + "': dscpp_fp32_params does not match param_shapes");
      const PyValue& shapes = shapes_v.items()[0];
      for (size_t i = 0; i < list->size(); ++i)
        fp32[shapes.keys()[i].as_string()] = list->items()[i].as_tensor().to(at::kFloat);
    }
  } else {
    if (shapes_v.is_none() || !shapes_v.is_list())
      throw CheckpointError("'" + path + "' has no param_shapes: not a ZeRO checkpoint");
    const int world = static_cast<int>(need(model, "dp_world_size", path).as_int());
    // Each rank's file: its partition of every group (stage 3: fp32_flat_groups, one group).
    std::vector<std::vector<at::Tensor>> files(world);  // [rank][group]
    std::vector<std::vector<int64_t>> paddings(shapes_v.size());
    bool stage3 = false;
    const SaveBinding model_binding = read_binding(model, path);
    for (int r = 0; r < world; ++r) {
      const std::string zpath = zero_file(r);
      PyValue z = load_torch_file(zpath);
      check_partition_binding(model_binding, path, read_binding(z, zpath), zpath, r);
      const PyValue& osd = need(z, "optimizer_state_dict", zpath);
      const PyValue* flat = osd.find(PyValue("fp32_flat_groups"));
      stage3 = flat != nullptr;
      if (flat && (flat->size() != 1 || shapes_v.size() != 1))
        throw CheckpointError("'" + zpath + "': dscpp reads stage-3 checkpoints of one group");
      const PyValue& parts = flat ? *flat : need(osd, "single_partition_of_fp32_groups", zpath);
      if (parts.size() != shapes_v.size())
        throw CheckpointError("'" + zpath + "' holds " + std::to_string(parts.size()) +
                              " parameter groups, param_shapes " + std::to_string(shapes_v.size()));
      if (const PyValue* p = osd.find(PyValue("param_alignment_paddings"))) {
        for (size_t g = 0; g < p->size() && g < paddings.size(); ++g)
          paddings[g] = p->items()[g].as_ints();
      }
      for (size_t g = 0; g < parts.size(); ++g)
        files[r].push_back(parts.items()[g].as_tensor().to(at::kFloat).reshape({-1}));
    }
    // DeepSpeed's partition arithmetic (ds_partition.h) says where each parameter's elements
    // sit in each rank's file, at every stage.
    for (size_t g = 0; g < shapes_v.size(); ++g) {
      const PyValue& shapes = shapes_v.items()[g];
      std::vector<std::vector<int64_t>> dims;
      std::vector<int64_t> numels;
      for (size_t i = 0; i < shapes.size(); ++i) {
        dims.push_back(shapes.values()[i].as_ints());
        numels.push_back(c10::multiply_integers(dims.back()));
      }
      if (!paddings[g].empty() && paddings[g].size() != numels.size())
        throw CheckpointError("'" + tag_dir(dir, tag) + "': " + std::to_string(paddings[g].size()) +
                              " alignment paddings for " + std::to_string(numels.size()) +
                              " parameters");
      const DsLayout ds = stage3 ? DsLayout::build_stage3(numels, world)
                                 : DsLayout::build(numels, world, paddings[g]);
      std::vector<at::Tensor> flat(numels.size());
      for (size_t i = 0; i < numels.size(); ++i) flat[i] = at::empty({numels[i]}, at::kFloat);
      for (int r = 0; r < world; ++r) {
        const at::Tensor& file = files[r][g];
        for (const DsLayout::Segment& s : ds.segments(r)) {
          if (s.at + s.count > file.numel())
            throw CheckpointError("'" + zero_file(r) + "' holds " + std::to_string(file.numel()) +
                                  " elements, fewer than param_shapes needs");
          flat[s.param]
              .slice(0, s.first, s.first + s.count)
              .copy_(file.slice(0, s.at, s.at + s.count));
        }
      }
      for (size_t i = 0; i < numels.size(); ++i)
        fp32[shapes.keys()[i].as_string()] = flat[i].view(dims[i]);
    }
  }

  PyValue out = PyValue::ordered_dict();
  // Stage 3's module holds no partitioned parameter (a MoE one's only the experts from their
  // files): those come in param_shapes' order.
  bool partitioned = false;
  for (const auto& [name, t] : fp32) partitioned |= !module.contains(PyValue(name));
  if (partitioned) {
    if (!shapes_v.is_none())
      for (const auto& g : shapes_v.items())
        for (const auto& k : g.keys())
          if (fp32.count(k.as_string())) out.set(k, PyValue(fp32[k.as_string()]));
  }
  for (size_t i = 0; i < module.size(); ++i) {
    const std::string& name = module.keys()[i].as_string();
    auto it = fp32.find(name);
    const PyValue& v = module.values()[i];
    if (it != fp32.end()) {
      out.set(PyValue(name), PyValue(it->second));
    } else if (v.is_tensor()) {
      at::Tensor t = v.as_tensor();
      out.set(PyValue(name), PyValue(t.is_floating_point() ? t.to(at::kFloat) : t));
    }
  }
  // Shared parameters: each alias is its source's tensor.
  if (const PyValue* shared = model.find(PyValue("shared_params")); shared && shared->is_dict()) {
    for (size_t i = 0; i < shared->size(); ++i) {
      const PyValue* src = out.find(shared->values()[i]);
      if (src) out.set(shared->keys()[i], *src);
    }
  }
  return out;
}

}  // namespace

}  // namespace dscpp::checkpoint
