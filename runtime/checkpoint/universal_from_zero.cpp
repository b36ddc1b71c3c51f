// A checkpoint of ours as a universal checkpoint: see universal_from_zero.h.
#include "dscpp/runtime/checkpoint/universal_from_zero.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/ds_partition.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/moe_pipe_stage.h"
#include "dscpp/runtime/checkpoint/pipe_checkpoint.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/py_dict.h"
#include "dscpp/runtime/checkpoint/save_binding.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"

namespace dscpp::checkpoint {

using detail::need;

namespace {

// The dict without the given keys (the big tensors ds_to_universal leaves out too).
PyValue without(const PyValue& dict, const std::set<std::string>& drop) {
  PyValue out = PyValue::dict();
  for (size_t i = 0; i < dict.size(); ++i) {
    const PyValue& k = dict.keys()[i];
    if (k.is_string() && drop.count(k.as_string())) continue;
    out.set(k, dict.values()[i]);
  }
  return out;
}

// param_shapes as one group, the one-rank model's: every parameter of `params` at its shape.
void set_one_rank_shapes(PyValue& model, const std::vector<UniversalParam>& params) {
  PyValue shapes = PyValue::ordered_dict();
  for (const UniversalParam& p : params) {
    PyValue dims = PyValue::list();
    for (int64_t d : p.fp32.sizes()) dims.append(PyValue(d));
    shapes.set(PyValue(p.name), std::move(dims));
  }
  PyValue groups = PyValue::list();
  groups.append(std::move(shapes));
  model.set("param_shapes", std::move(groups));
}

// A tensor-parallel checkpoint of the plain engine (mp_rank_XX per tensor rank): every rank's
// parameters consolidated over its data ranks, each split tensor (the module's too) merged over
// the tensor ranks (tp_reshape.h), and its dscpp_partition filled from dscpp_tensor_parallel:
// the whole tensor and how it was cut, which the universal files carry. With experts
// (DeepSpeed's MoE layout per tensor rank: layer_L_expert_E_mp_rank_XX files, the experts' ZeRO
// group in its zero_pp_rank_D_mp_rank_XX files), each tensor rank's part is read as a pipeline
// MoE stage's, as the one-rank model's (moe_pipe_stage.h); the experts are replicated over the
// tensor ranks and have no partition, so tensor rank 0's stand.
void tensor_parallel_params(const std::string& dir, const std::string& tag,
                            const std::string& path0, UniversalCheckpoint& ck, PyValue& module) {
  const bool moe = ck.model.contains(PyValue("num_experts"));
  const PyValue& info = need(ck.model, "dscpp_tensor_parallel", path0);
  const int t = static_cast<int>(need(info, "tp_degree", path0).as_int());
  std::map<std::string, ParamPartition> parts;
  const PyValue& pp = need(info, "partitions", path0);
  for (size_t i = 0; i < pp.size(); ++i)
    parts.emplace(pp.keys()[i].as_string(),
                  ParamPartition::from_py(pp.values()[i], path0 + ": " + pp.keys()[i].as_string()));
  auto merge = [&](const std::string& name, const std::vector<at::Tensor>& shards) {
    auto it = parts.find(name);
    return it == parts.end() ? shards.at(0) : merge_tp_shards(shards, it->second, name);
  };
  const SaveBinding b0 = read_binding(ck.model, path0);
  std::vector<PyValue> modules;
  std::vector<std::map<std::string, UniversalParam>> by_rank(static_cast<size_t>(t));
  std::vector<std::string> names;
  for (int r = 0; r < t; ++r) {
    const std::string path = pipe_model_states_path(dir, tag, 0, r, t);
    const PyValue model = r == 0 ? ck.model : load_torch_file(path);
    const SaveBinding b = read_binding(model, path);
    if (b.save_id != b0.save_id || b.global_steps != b0.global_steps)
      throw CheckpointError("'" + path + "' was not written by the save of '" + path0 +
                            "': files of another run");
    auto zero_file = [&](int dp) {
      for (bool bf16 : {false, true}) {
        const std::string z = pipe_zero_states_path(dir, tag, dp, 0, r, t, bf16);
        if (std::filesystem::is_regular_file(z)) return z;
      }
      throw CheckpointError(fmt::format(
          "'{}' has no ZeRO partition file of tensor rank {}, data rank {} (expected {})",
          tag_dir(dir, tag), r, dp, pipe_zero_states_path(dir, tag, dp, 0, r, t, false)));
    };
    std::vector<UniversalParam> params;
    if (moe) {
      PipeMoeStage part(dir, tag, model, path, r, zero_file);
      // The optimizer's settings, as moe_params reads them (the dense group's files).
      if (r == 0)
        consolidate_params(model, path, need(model, "module", path), zero_file,
                           &ck.optimizer_state);
      modules.push_back(std::move(part.module));
      params = std::move(part.params);
    } else {
      modules.push_back(need(model, "module", path));
      params = consolidate_all_groups(model, path, modules.back(), zero_file,
                                      r == 0 ? &ck.optimizer_state : nullptr);
    }
    for (auto& p : params) {
      auto& mine = by_rank[static_cast<size_t>(r)];
      if (mine.count(p.name)) continue;  // (a MoE stage at ep 1 lists its experts twice)
      if (r == 0) names.push_back(p.name);
      mine[p.name] = std::move(p);
    }
  }
  if (moe) module = modules.at(0);
  for (const std::string& name : names) {
    std::vector<const UniversalParam*> of;
    for (int r = 0; r < t; ++r) {
      auto it = by_rank[static_cast<size_t>(r)].find(name);
      if (it == by_rank[static_cast<size_t>(r)].end())
        throw CheckpointError(
            fmt::format("'{}': tensor rank {} has no parameter '{}'", tag_dir(dir, tag), r, name));
      of.push_back(&it->second);
    }
    UniversalParam u;
    u.name = name;
    std::vector<at::Tensor> shards;
    for (const auto* p : of) shards.push_back(p->fp32);
    u.fp32 = merge(name, shards);
    for (const auto& [state, value] : of[0]->states) {
      std::vector<at::Tensor> st;
      for (const auto* p : of) st.push_back(p->states.at(state));
      u.states[state] = merge(name, st);
    }
    u.step = of[0]->step;
    auto it = parts.find(name);
    u.partition = it != parts.end() ? it->second : ParamPartition::whole(u.fp32.sizes().vec());
    ck.params.push_back(std::move(u));
  }
  PyValue whole = PyValue::ordered_dict();
  for (size_t i = 0; i < module.size(); ++i) {
    if (!module.values()[i].is_tensor()) {
      whole.set(module.keys()[i], module.values()[i]);
      continue;
    }
    const std::string name = module.keys()[i].as_string();
    std::vector<at::Tensor> shards;
    for (int r = 0; r < t; ++r) {
      const PyValue* v = modules[static_cast<size_t>(r)].find(PyValue(name));
      if (!v || !v->is_tensor())
        throw CheckpointError(
            fmt::format("'{}': tensor rank {}'s module has no '{}'", tag_dir(dir, tag), r, name));
      shards.push_back(v->as_tensor());
    }
    whole.set(module.keys()[i], PyValue(merge(name, shards)));
  }
  module = std::move(whole);
  if (moe) {  // the one-rank model's, no longer cut by expert-parallel rank
    ck.model = without(ck.model, {"num_experts", "dscpp_moe"});
    set_one_rank_shapes(ck.model, ck.params);
  }
}

// A pipeline or 3D checkpoint (pipe_checkpoint.h reads it whole: every stage's layer files,
// each split tensor merged over the model ranks): the one-rank model's module and parameters,
// each with how the save cut it. The model states are stage 0's (model rank 0's), made the
// whole model's: param_shapes lists every parameter, the per-stage entries (dscpp_pipe,
// dscpp_tensor_parallel, the RNG states of stage 0's ranks, and a MoE stage's num_experts and
// dscpp_moe, which list stage 0's MoE layers and its ep cut only) go, since the folder is no
// longer cut by stage, model rank or expert-parallel rank.
void pipe_params(const std::string& dir, const std::string& tag, UniversalCheckpoint& ck,
                 PyValue& module) {
  PipeCheckpoint pipe = read_pipe_checkpoint(dir, tag);
  ck.model = without(pipe.models.at(0), {"dscpp_pipe", "dscpp_tensor_parallel", "dscpp_rng_states",
                                         "num_experts", "dscpp_moe"});
  set_one_rank_shapes(ck.model, pipe.params);
  ck.model.set("mp_world_size", PyValue(1));
  PyValue dims = PyValue::dict();
  dims.set(PyValue("pp_degree"), PyValue(1));
  dims.set(PyValue("tp_degree"), PyValue(1));
  ck.model.set("checkpoint_parallel_dimensions", std::move(dims));
  ck.params = std::move(pipe.params);
  ck.optimizer_state = std::move(pipe.optimizer_state);
  module = std::move(pipe.module);
}

// A MoE checkpoint of the plain engine (moe_layout.h: num_experts, the experts in their own
// files): the one-rank model's module and parameters, every global expert a local one under its
// whole-model name (clones deepspeed_experts.<E>, stacked weights [E, ...]), as a pipeline's MoE
// stage is read. At ep_size 1 the experts are ordinary parameters of the one ZeRO group (the
// saving ranks' names are the one-rank model's); at E > 1 they are expert-parallel rank R's over
// its expert-data ranks (moe_relayout.h). The model states lose num_experts and dscpp_moe (the
// folder is no longer cut by expert-parallel rank: a universal load reads every expert from
// zero/), and param_shapes becomes the one-rank model's single group.
void moe_params(const std::string& dir, const std::string& tag, const std::string& path,
                UniversalCheckpoint& ck, PyValue& module) {
  auto zero_file = [&](int r) { return find_zero_states(dir, tag, r); };
  if (moe_ep_size(ck.model) > 1) {
    PipeMoeStage stage(dir, tag, ck.model, path, 0, zero_file);
    // The optimizer's settings, as from a dense checkpoint: those of the dense group's files
    // (their param_groups list the experts' too, marked moe as DeepSpeed's). This reads the
    // dense partitions a second time: an offline tool's cost, for one reader of the settings.
    consolidate_params(ck.model, path, need(ck.model, "module", path), zero_file,
                       &ck.optimizer_state);
    ck.params = std::move(stage.params);
    module = std::move(stage.module);
  } else {
    auto files = ExpertFiles::of_model(dir, tag, ck.model, path);
    const auto saved = experts_of_info(ck.model, path);
    files.check_model(saved);
    module = module_with_experts(need(ck.model, "module", path), saved, files);
    PyValue view = ck.model;
    view.set(PyValue("module"), module);
    ck.params = consolidate_params(view, path, module, zero_file, &ck.optimizer_state);
  }
  ck.model = without(ck.model, {"num_experts", "dscpp_moe"});
  set_one_rank_shapes(ck.model, ck.params);
}

}  // namespace

size_t param_groups_of(const PyValue& model, const std::string& path) {
  const PyValue& shapes = need(model, "param_shapes", path);
  const bool moe = moe_ep_size(model) > 1;
  if (!shapes.is_list() || shapes.size() < 1 || (moe && shapes.size() < 2))
    throw CheckpointError(fmt::format(
        "'{}': param_shapes is not a list of parameter groups ({})", path,
        moe ? "two or more for a MoE checkpoint saved at ep_size > 1: the dense ones, then the "
              "experts'"
            : "one or more"));
  return shapes.size();
}

std::vector<UniversalParam> consolidate_all_groups(const PyValue& model, const std::string& path,
                                                   const PyValue& module,
                                                   const std::function<std::string(int)>& zero_file,
                                                   PyValue* optimizer_state) {
  std::vector<UniversalParam> params;
  const size_t groups = param_groups_of(model, path);
  for (size_t g = 0; g < groups; ++g) {
    ZeroGroup which;
    which.group = g;
    for (auto& p : consolidate_params(model, path, module, zero_file,
                                      g == 0 ? optimizer_state : nullptr, which))
      params.push_back(std::move(p));
  }
  return params;
}

std::vector<UniversalParam> consolidate_params(const PyValue& model, const std::string& path,
                                               const PyValue& module,
                                               const std::function<std::string(int)>& zero_file,
                                               PyValue* optimizer_state, const ZeroGroup& which) {
  std::vector<UniversalParam> params;
  PyValue settings;
  // The trainable parameters in ZeRO's (registration) order: param_shapes, one group per
  // ZeroOptimizer (the experts' last in a MoE checkpoint at ep_size > 1, moe_layout.h; Muon's half
  // and the Adam half for DeepSpeed's Muon).
  const PyValue& shapes_v = need(model, "param_shapes", path);
  const size_t groups_expected = param_groups_of(model, path);
  if (which.group >= groups_expected)
    throw CheckpointError(fmt::format("'{}': param_shapes has {} groups, no group {}", path,
                                      groups_expected, which.group));
  const PyValue& shapes = shapes_v.items()[which.group];
  // Stage 0: the group's entries in the optimizer state follow the earlier groups'.
  int64_t first_index = 0;
  for (size_t g = 0; g < which.group; ++g)
    first_index += static_cast<int64_t>(shapes_v.items()[g].size());
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> dims;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < shapes.size(); ++i) {
    names.push_back(shapes.keys()[i].as_string());
    dims.push_back(shapes.values()[i].as_ints());
    numels.push_back(c10::multiply_integers(dims.back()));
  }
  params.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    params[i].name = names[i];
    // Whole on every rank: tensor parallelism, when it comes, fills partition_dim and sizes.
    params[i].partition = ParamPartition::whole(dims[i]);
  }

  const PyValue& optimizer =
      which.stage0_optimizer ? *which.stage0_optimizer : need(model, "optimizer", path);
  if (!optimizer.is_none()) {
    // Stage 0: torch.optim's per-parameter state; fp32 weights beside it under 16-bit.
    // The message's text named first: g++ 13 takes a reference returned by a call with a
    // temporary argument for a dangling one (-Wdangling-reference).
    const std::string where = path + ": optimizer";
    const PyValue& state = need(optimizer, "state", where);
    const PyValue* fp32 = optimizer.find(PyValue("dscpp_fp32_params"));
    for (size_t i = 0; i < names.size(); ++i) {
      UniversalParam& p = params[i];
      const int64_t index = first_index + static_cast<int64_t>(i);
      if (fp32) {
        if (static_cast<size_t>(index) >= fp32->size())
          throw CheckpointError(
              fmt::format("'{}': dscpp_fp32_params has {} tensors, fewer than "
                          "param_shapes names",
                          where, fp32->size()));
        p.fp32 = fp32->items().at(index).as_tensor().to(at::kFloat).reshape(dims[i]);
      } else {
        p.fp32 = need(module, names[i].c_str(), path + ": module").as_tensor().to(at::kFloat);
      }
      const PyValue* entry = state.find(PyValue(index));
      if (!entry) continue;  // never stepped
      for (size_t k = 0; k < entry->size(); ++k) {
        const std::string key = entry->keys()[k].as_string();
        const PyValue& v = entry->values()[k];
        if (key == "step")
          p.step = v;
        else if (v.is_tensor())
          p.states[key] = v.as_tensor().to(at::kFloat).reshape(dims[i]);
      }
    }
    settings = PyValue::dict();
    settings.set("param_groups", need(optimizer, "param_groups", path + ": optimizer"));
    settings.set("zero_stage", PyValue(0));
    const PyValue* cfg = model.find(PyValue("ds_config"));
    const PyValue* clip = cfg && cfg->is_dict() ? cfg->find(PyValue("gradient_clipping")) : nullptr;
    settings.set("clip_grad", clip ? PyValue(clip->as_double()) : PyValue(0.0));
    settings.set("dynamic_loss_scale", PyValue(false));
    settings.set("overflow", PyValue(false));
    settings.set("ds_version", need(model, "ds_version", path));
  } else {
    const int world = which.partitions > 0
                          ? which.partitions
                          : static_cast<int>(need(model, "dp_world_size", path).as_int());
    if (world < 1) throw CheckpointError("'" + path + "': dp_world_size < 1");
    const SaveBinding binding = read_binding(model, path);
    const size_t g = which.group;
    std::vector<at::Tensor> fp32(names.size());
    std::map<std::string, std::vector<at::Tensor>> states;
    for (size_t i = 0; i < names.size(); ++i) fp32[i] = at::zeros({numels[i]}, at::kFloat);
    for (int r = 0; r < world; ++r) {
      const int rank = which.rank_of ? which.rank_of(r) : r;
      const std::string zpath = zero_file(rank);
      PyValue z = load_torch_file(zpath);
      check_partition_binding(binding, path, read_binding(z, zpath), zpath, rank);
      const PyValue& osd = need(z, "optimizer_state_dict", zpath);
      const bool stage3 = osd.contains(PyValue("fp32_flat_groups"));
      std::vector<int64_t> paddings;
      if (const PyValue* pad = osd.find(PyValue("param_alignment_paddings")))
        if (pad->is_list() && pad->size() == groups_expected) paddings = pad->items()[g].as_ints();
      const DsLayout ds =
          stage3 ? DsLayout::build_stage3(numels, world) : DsLayout::build(numels, world, paddings);
      const PyValue& groups =
          need(osd, stage3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups", zpath);
      if (!groups.is_list() || groups.size() != groups_expected)
        throw CheckpointError(fmt::format("'{}' does not hold {} parameter group{}", zpath,
                                          groups_expected, groups_expected == 1 ? "" : "s"));
      const PyValue& base =
          need(osd, stage3 ? "optimizer_state_dict" : "base_optimizer_state", zpath);
      const PyValue* entry = need(base, "state", zpath).find(PyValue(static_cast<int64_t>(g)));
      // Each flat tensor of this file (the master weights, each state) into the parameters.
      auto scatter = [&](const at::Tensor& flat_in, std::vector<at::Tensor>& into,
                         const std::string& what) {
        const at::Tensor flat = flat_in.to(at::kFloat).reshape({-1});
        for (const DsLayout::Segment& s : ds.segments(r)) {
          if (s.at + s.count > flat.numel())
            throw CheckpointError(
                fmt::format("'{}': {} holds {} elements, fewer than "
                            "param_shapes needs",
                            zpath, what, flat.numel()));
          into[s.param]
              .slice(0, s.first, s.first + s.count)
              .copy_(flat.slice(0, s.at, s.at + s.count));
        }
      };
      scatter(groups.items()[g].as_tensor(), fp32, "the fp32 partition");
      if (r == 0) {
        std::set<std::string> drop = {"base_optimizer_state", "single_partition_of_fp32_groups",
                                      "fp32_flat_groups", "optimizer_state_dict",
                                      "param_slice_mappings"};
        settings = without(osd, drop);
        settings.set("param_groups", need(base, "param_groups", zpath));
      }
      if (!entry) continue;  // never stepped: no state
      for (size_t k = 0; k < entry->size(); ++k) {
        const std::string key = entry->keys()[k].as_string();
        const PyValue& v = entry->values()[k];
        if (key == "step") {
          for (auto& p : params) p.step = v;
          continue;
        }
        if (!v.is_tensor()) continue;
        auto& per_param = states[key];
        if (per_param.empty())
          for (int64_t n : numels) per_param.push_back(at::zeros({n}, at::kFloat));
        // DeepSpeed's Muon half (ZeRO 1-2) keeps its momentum with each matrix whole.
        if (!stage3 && key == "momentum_buffer" && is_muon_group(base, g)) {
          const at::Tensor flat = v.as_tensor().to(at::kFloat).reshape({-1});
          int64_t at = 0;
          for (int i : ds_whole_params(ds, r)) {
            if (at + numels[i] > flat.numel())
              throw CheckpointError(fmt::format(
                  "'{}': Muon's momentum_buffer holds {} elements, fewer than its matrices'", zpath,
                  flat.numel()));
            per_param[i].copy_(flat.slice(0, at, at + numels[i]));
            at += numels[i];
          }
          continue;
        }
        scatter(v.as_tensor(), per_param, "optimizer state " + key);
      }
    }
    for (size_t i = 0; i < names.size(); ++i) {
      params[i].fp32 = fp32[i].view(dims[i]);
      for (auto& [key, per_param] : states) params[i].states[key] = per_param[i].view(dims[i]);
    }
  }

  if (optimizer_state) *optimizer_state = std::move(settings);
  return params;
}

UniversalCheckpoint universal_from_zero_checkpoint(const std::string& dir,
                                                   const std::string& tag_in) {
  std::string tag = tag_in;
  const std::string path = resolve_model_states(dir, tag);
  if (!std::filesystem::exists(path))
    throw CheckpointError("'" + tag_dir(dir, tag) + "' has no model states file (expected " +
                          model_states_path(dir, tag) + ")");
  UniversalCheckpoint ck;
  ck.model = load_torch_file(path);
  PyValue module;
  if (is_pipe_checkpoint(ck.model)) {
    pipe_params(dir, tag, ck, module);
  } else {
    module = need(ck.model, "module", path);
    if (ck.model.find(PyValue("dscpp_tensor_parallel"))) {
      tensor_parallel_params(dir, tag, path, ck, module);
    } else if (ck.model.find(PyValue("num_experts"))) {
      moe_params(dir, tag, path, ck, module);
    } else {
      ck.params = consolidate_all_groups(
          ck.model, path, module, [&](int r) { return find_zero_states(dir, tag, r); },
          &ck.optimizer_state);
    }
  }

  // The model states: a whole module (stage 3's holds no partitioned parameter), and
  // DeepSpeed's universal_checkpoint_info.
  PyValue whole = PyValue::ordered_dict();
  for (const UniversalParam& p : ck.params) {
    const PyValue* old = module.find(PyValue(p.name));
    const auto dtype = old && old->is_tensor() ? old->as_tensor().scalar_type() : at::kFloat;
    whole.set(PyValue(p.name), PyValue(p.fp32.to(dtype)));
  }
  for (size_t i = 0; i < module.size(); ++i)
    if (!whole.contains(module.keys()[i])) whole.set(module.keys()[i], module.values()[i]);
  // A shared parameter's other names are its tensor again (at stage 3 they were absent).
  if (const PyValue* shared = ck.model.find(PyValue("shared_params")); shared && shared->is_dict())
    for (size_t i = 0; i < shared->size(); ++i)
      if (const PyValue* src = whole.find(shared->values()[i]))
        whole.set(shared->keys()[i], PyValue(*src));
  ck.model.set("module", std::move(whole));
  PyValue info = PyValue::dict();
  info.set("universal_checkpoint_version", PyValue(kUniversalVersion));
  ck.model.set("universal_checkpoint_info", std::move(info));
  return ck;
}

}  // namespace dscpp::checkpoint
