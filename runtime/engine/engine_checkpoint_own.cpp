// Loading a checkpoint laid out as this engine's own partitions (EngineCore::is_own_layout):
// the plain engine's files at this ZeRO stage and expert-parallel degree, on any number of data
// ranks. The module is read whole (its names and shapes checked against the model's); each
// rank reads every saved partition file and copies the pieces that fall in its own chunks
// (runtime/checkpoint/ds_partition.h), so N ranks' checkpoint loads on M. Every other layout goes
// through the checkpoint's normal form (engine_checkpoint_load.cpp).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <map>
#include <set>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/ds_partition.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/pipe_checkpoint.h"
#include "dscpp/runtime/checkpoint/save_binding.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/engine_experts.h"
#include "dscpp/runtime/engine/moe_checkpoint.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;
using namespace engine_checkpoint;

bool EngineCore::load_module(const PyValue& model, const std::string& path,
                             const LoadCheckpointOptions& options, LoadCheckpointResult& result) {
  const PyValue& module = need(model, "module", path);
  if (!module.is_dict()) throw CheckpointError("'" + path + "': 'module' is not a state dict");
  std::vector<std::string> missing, mismatched, unexpected_params;
  std::set<std::string> ours;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  auto visit = [&](const NamedParams& named) {
    for (const auto& [name, t] : named) {
      ours.insert(name);
      const PyValue* v = module.find(PyValue(name));
      if (!v || !v->is_tensor()) {
        missing.push_back(name);
        continue;
      }
      const at::Tensor& src = v->as_tensor();
      if (src.sizes() != t.sizes()) {
        mismatched.push_back(fmt::format("{} (checkpoint {}, model {})", name,
                                         fmt::join(src.sizes(), "x"), fmt::join(t.sizes(), "x")));
        continue;
      }
      copies.emplace_back(t, src);
    }
  };
  if (zero_->stage() < 3) {
    visit(named_params_());
  } else {
    // Parameters outside ZeRO (frozen ones) are in `module` as at the other stages. The
    // experts' own ZeroOptimizer (ep_size > 1) partitions its parameters too.
    std::set<std::string> partitioned;
    for (const auto& p : zero_set_) partitioned.insert(p.names->begin(), p.names->end());
    for (const auto& [alias, name] : shared_params_) partitioned.insert(alias);
    NamedParams others;
    for (const auto& [name, p] : named_params_())
      if (!partitioned.count(name)) others.emplace_back(name, p);
    visit(others);
    // A MoE checkpoint's view holds this rank's experts from their files (moe_checkpoint.h):
    // their values come from the ZeRO files too.
    ours.insert(partitioned.begin(), partitioned.end());
    // The parameters' values come from the ZeRO files; their names and shapes must match.
    // Expert parameters are left to the expert files' checks (moe_model_view: the MoE layers
    // and their expert counts), since their local names and shapes follow the saving
    // expert-parallel degree.
    std::set<std::string> expert_names;
    if (client_.expert_params)
      for (const auto& [name, e] : *client_.expert_params) expert_names.insert(name);
    if (model.contains(PyValue("dscpp_moe")))
      for (const auto& [name, e] : checkpoint::experts_of_info(model, path))
        expert_names.insert(name);
    const PyValue& shapes_v = need(model, "param_shapes", path);
    std::map<std::string, std::vector<int64_t>> saved;
    if (shapes_v.is_list())
      for (const auto& g : shapes_v.items())
        for (size_t i = 0; i < g.size(); ++i)
          if (!expert_names.count(g.keys()[i].as_string()))
            saved[g.keys()[i].as_string()] = g.values()[i].as_ints();
    for (const auto& part : zero_set_) {
      const auto& names = *part.names;
      for (size_t i = 0; i < names.size(); ++i) {
        if (expert_names.count(names[i])) continue;
        auto it = saved.find(names[i]);
        if (it == saved.end()) {
          missing.push_back(names[i]);
        } else if (it->second != part.zero->param_shape(i)) {
          mismatched.push_back(fmt::format("{} (checkpoint {}, model {})", names[i],
                                           fmt::join(it->second, "x"),
                                           fmt::join(part.zero->param_shape(i), "x")));
        }
        saved.erase(names[i]);
      }
    }
    for (const auto& [name, shape] : saved) unexpected_params.push_back(name);
  }
  visit(named_buffers_());
  std::vector<std::string> unexpected = unexpected_params;
  for (const auto& k : module.keys())
    if (!k.is_string() || !ours.count(k.as_string()))
      unexpected.push_back(k.is_string() ? k.as_string() : "<non-string key>");
  const bool strict = options.load_module_strict;
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string msg = "'" + path + "' is a checkpoint of another model:";
    if (!missing.empty()) msg += " missing " + list_names(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected " + list_names(unexpected) + ";";
    if (!mismatched.empty()) msg += " shapes differ for " + list_names(mismatched) + ";";
    msg.pop_back();
    if (mismatched.empty())
      msg += " (load_module_strict=false tolerates missing and unexpected keys)";
    throw CheckpointError(msg);
  }
  // Not strict: do ZeRO's parameters differ from those the checkpoint's partitions hold?
  // (Buffers and frozen parameters live outside them.) Stage 0 checkpoints of DeepSpeed
  // name no parameters: any unexpected key counts.
  bool other_params = false;
  std::set<std::string> trainable;  // (the experts' are the expert files' to check)
  for (const auto& part : zero_set_)
    if (!experts() || part.zero != &experts()->zero())
      trainable.insert(part.names->begin(), part.names->end());
  for (const auto& name : missing) other_params |= trainable.count(name) > 0;
  const PyValue* shapes = model.find(PyValue("param_shapes"));
  for (const auto& name : unexpected) {
    bool saved_param = !shapes || !shapes->is_list();
    if (!saved_param)
      for (const auto& g : shapes->items()) saved_param |= g.find(PyValue(name)) != nullptr;
    other_params |= saved_param;
  }
  std::string differ;  // "missing a, b; unexpected c"
  if (!missing.empty()) differ = "missing " + list_names(missing);
  if (!unexpected.empty())
    differ += (differ.empty() ? "" : "; ") + std::string("unexpected ") + list_names(unexpected);
  if (other_params && zero_->stage() == 3)
    throw CheckpointError("'" + path + "': at ZeRO stage 3 the parameters' values are in the " +
                          "checkpoint's partitions, laid out for its own parameters: they " +
                          "cannot load into a model whose parameters differ (" + differ +
                          "), even with load_module_strict=false");
  if (other_params && options.load_optimizer_states && !options.load_module_only)
    throw CheckpointError("'" + path + "': with load_module_strict=false the module's " +
                          "parameters differ from the checkpoint's (" + differ +
                          "), so its optimizer state does not fit them: pass " +
                          "load_optimizer_states=false or load_module_only=true");
  if (!differ.empty()) {
    if (group_->rank() == 0)
      std::cerr << "dscpp: load_checkpoint with load_module_strict=false: '" << path
                << "': " << differ << " (missing keys keep their values, unexpected ones are "
                << "ignored)\n";
    result.missing_keys = missing;
    result.unexpected_keys = unexpected;
  }
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(src);
  return other_params;
}

namespace {

// Stage 0: `zero`'s parameters (names: its order) from torch.optim's state dict `optimizer`,
// where they are entries first.. (a MoE checkpoint's experts follow the dense parameters).
void load_stage0(zero::ZeroOptimizer& zero, const std::vector<std::string>& names,
                 const PyValue& optimizer, const std::string& path, int64_t first,
                 bool load_optimizer_states) {
  if (optimizer.is_none())
    throw CheckpointError("'" + path + "' holds no optimizer state (a ZeRO stage 1-2 checkpoint?)");
  const auto& layout = zero.layout();
  const auto& params = zero.params();
  const PyValue* fp32 = optimizer.find(PyValue("dscpp_fp32_params"));
  if (fp32) {
    if (!fp32->is_list() || fp32->size() < first + params.size())
      throw CheckpointError("'" + path + "': dscpp_fp32_params does not match the parameters");
    at::Tensor master = zero.master_partition();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& lp = layout.params[i];
      master.slice(0, lp.offset, lp.offset + lp.numel)
          .copy_(fp32->items()[first + i].as_tensor().reshape({-1}));
    }
    zero.set_master_partition(master);
  } else {
    zero.refresh_master_from_params();
  }
  if (!load_optimizer_states) return;
  const std::string where = path + ": optimizer";
  const PyValue& state = need(optimizer, "state", where);
  int64_t step = 0;
  std::map<std::string, at::Tensor> parts;  // each state over the whole partition
  for (const auto& name : zero.state_names()) parts[name] = zero.state_partition(name);
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t index = first + static_cast<int64_t>(i);
    const PyValue* entry = state.find(PyValue(index));
    if (!entry) {
      // torch.optim has no state for a parameter that never stepped: it keeps the zeros.
      continue;
    }
    const auto& lp = layout.params[i];
    for (auto& [name, t] : parts) {
      const std::string entry_path = path + ": optimizer state " + std::to_string(index);
      const PyValue& src = need(*entry, name.c_str(), entry_path);
      if (src.as_tensor().numel() != lp.numel)
        throw CheckpointError(
            fmt::format("'{}': optimizer state {} of parameter {} has {} "
                        "elements, the parameter {}",
                        path, name, names.at(i), src.as_tensor().numel(), lp.numel));
      t.slice(0, lp.offset, lp.offset + lp.numel).copy_(src.as_tensor().reshape({-1}));
    }
    if (const PyValue* s = entry->find(PyValue("step"))) step = step_of(*s);
  }
  for (const auto& [name, t] : parts) zero.load_state_partition(name, t);
  zero.set_step_count(step);
}

// Group g (of `groups`) of one saved ZeRO file, partition `part` of `count`, into what of it
// `zero` holds: the fp32 master (written back at once) and, when `states` is given, each
// optimizer state into (*states)[name] (the whole partition; the caller loads them after the
// last file) and the step into *step.
void load_zero_group(zero::ZeroOptimizer& zero, const PyValue& osd, const std::string& path,
                     size_t g, size_t groups, int part, int count,
                     std::map<std::string, at::Tensor>* states, int64_t* step) {
  const int64_t stage = need(osd, "zero_stage", path).as_int();
  const bool stage3 = stage >= 3;
  std::vector<int64_t> paddings;
  if (const PyValue* p = osd.find(PyValue("param_alignment_paddings")))
    if (p->is_list() && p->size() == groups) paddings = p->items()[g].as_ints();
  const auto ds = ds_layout(static_cast<int>(stage), numels_of(zero), count, paddings);
  const int64_t held = ds.held(part);
  const PyValue& flat =
      need(osd, stage3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups", path);
  if (!flat.is_list() || flat.size() != groups)
    throw CheckpointError(fmt::format("'{}' holds {} parameter groups; this engine has {}", path,
                                      flat.size(), groups));
  const at::Tensor& fp32 = flat.items()[g].as_tensor();
  if (fp32.numel() != held)
    throw CheckpointError(
        fmt::format("'{}' holds {} fp32 elements in group {}; partition {} of {} should hold {}",
                    path, fp32.numel(), g, part, count, held));
  const auto& layout = zero.layout();
  const int me = zero.layout_rank();
  at::Tensor master = zero.master_partition();
  checkpoint::from_ds_partition(layout, me, ds, part, fp32, master);
  zero.set_master_partition(master);
  if (!states) return;
  const PyValue& base = need(osd, stage3 ? "optimizer_state_dict" : "base_optimizer_state", path);
  if (base.is_list())
    throw CheckpointError("'" + path +
                          "' is an elastic checkpoint (zero_optimization.elastic_checkpoint), "
                          "which dscpp does not read");
  const std::string base_path = path + ": base_optimizer_state";
  const PyValue& state = need(base, "state", base_path);
  const PyValue* entry = state.find(PyValue(static_cast<int64_t>(g)));
  if (!entry) return;  // never stepped: zeros, as ours are
  // DeepSpeed's Muon half (ZeRO 1-2) keeps its momentum with each matrix whole.
  const bool muon = !stage3 && checkpoint::is_muon_group(base, g);
  for (auto& [name, t] : *states) {
    const at::Tensor& src = need(*entry, name.c_str(), base_path).as_tensor();
    if (muon && name == "momentum_buffer") {
      checkpoint::from_ds_whole_params(layout, me, ds, part, src, t);
      continue;
    }
    if (src.numel() < held)
      throw CheckpointError(
          fmt::format("'{}': optimizer state {} holds {} elements, fewer "
                      "than the partition's {}",
                      path, name, src.numel(), held));
    checkpoint::from_ds_partition(layout, me, ds, part, src.reshape({-1}).slice(0, 0, held), t);
  }
  if (const PyValue* s = entry->find(PyValue("step"))) {
    const int64_t st = step_of(*s);
    if (*step >= 0 && st != *step)
      throw CheckpointError(
          fmt::format("'{}': step {} differs from other partitions' {}", path, st, *step));
    *step = st;
  }
}

}  // namespace

void EngineCore::load_stage0_optimizer(const PyValue& model, const std::string& path,
                                       bool load_optimizer_states) {
  // The partitions other than the experts' (their own files, after these), numbered one after
  // the other in the checkpoint's order.
  EngineExperts* ex = experts();
  int64_t first = 0;
  for (const auto* p : checkpoint_partitions()) {
    if (ex && p->zero == &ex->zero()) continue;
    load_stage0(*p->zero, *p->names, need(model, "optimizer", path), path, first,
                load_optimizer_states);
    first += static_cast<int64_t>(p->names->size());
  }
}

void EngineCore::load_zero_partitions(const std::string& dir, const std::string& tag,
                                      const PyValue& model, const std::string& model_path,
                                      bool load_optimizer_states, PyValue* settings) {
  const int saved_world = static_cast<int>(need(model, "dp_world_size", model_path).as_int());
  if (saved_world < 1) throw CheckpointError("'" + model_path + "': dp_world_size < 1");
  const checkpoint::SaveBinding model_binding = checkpoint::read_binding(model, model_path);
  if (model_binding.rank > 0)
    throw CheckpointError(fmt::format("'{}' was written by rank {} (dscpp_rank), not rank 0",
                                      model_path, model_binding.rank));
  // A MoE checkpoint at ep_size > 1 (loaded at the same degree) holds the experts as its last
  // group, partitioned over the expert-data group: the files of data ranks f with f % ep ==
  // this rank's expert-parallel rank hold its experts (moe_relayout.h).
  EngineExperts* ex = experts();
  const int ep = ex ? ex->ep_size() : 1;
  if (saved_world % ep != 0)
    throw CheckpointError(fmt::format("'{}': dp_world_size {} is not a multiple of ep_size {}",
                                      model_path, saved_world, ep));
  struct Target {
    zero::ZeroOptimizer* zero;
    bool experts;
    std::map<std::string, at::Tensor> parts;  // each state over the whole partition
    int64_t step = -1;
  };
  std::vector<Target> targets;  // the set's partitions, in checkpoint order
  for (const auto* p : checkpoint_partitions())
    targets.push_back({p->zero, ex && p->zero == &ex->zero(), {}, -1});
  const size_t groups = targets.size();
  for (auto& t : targets)
    for (const auto& name : t.zero->state_names()) t.parts[name] = t.zero->state_partition(name);
  for (int f = 0; f < saved_world; ++f) {
    const std::string path = checkpoint::find_zero_states(dir, tag, f);
    PyValue file = checkpoint::load_torch_file(path);
    checkpoint::check_partition_binding(model_binding, model_path,
                                        checkpoint::read_binding(file, path), path, f);
    const PyValue& osd = need(file, "optimizer_state_dict", path);
    if (f == 0 && settings) *settings = osd;
    const int64_t stage = need(osd, "zero_stage", path).as_int();
    if (stage != zero_->stage())
      throw CheckpointError(
          fmt::format("'{}' is a ZeRO stage {} checkpoint; this engine runs "
                      "stage {}",
                      path, stage, zero_->stage()));
    const PyValue& count_v = need(osd, "partition_count", path);
    const int64_t count = count_v.is_int()      ? count_v.as_int()
                          : count_v.size() >= 1 ? count_v.items()[0].as_int()
                                                : -1;
    if (count != saved_world)
      throw CheckpointError(fmt::format("'{}' was written by {} ranks, the model states say {}",
                                        path, count, saved_world));
    for (size_t g = 0; g < targets.size(); ++g) {
      Target& t = targets[g];
      if (t.experts && f % ep != ex->ep_rank()) continue;  // another expert rank's experts
      load_zero_group(*t.zero, osd, path, g, groups, t.experts ? f / ep : f,
                      t.experts ? saved_world / ep : saved_world,
                      load_optimizer_states ? &t.parts : nullptr, &t.step);
    }
  }
  if (!load_optimizer_states) return;
  for (auto& t : targets) {
    for (const auto& [name, value] : t.parts) t.zero->load_state_partition(name, value);
    if (t.step >= 0) t.zero->set_step_count(t.step);
  }
}

bool EngineCore::is_own_layout(const std::string& dir, const std::string& tag, const PyValue& model,
                               const std::string& path, const LoadCheckpointOptions& options) {
  if (checkpoint::is_pipe_checkpoint(model) || model.contains(PyValue("dscpp_tensor_parallel")) ||
      tensor_parallel_size() > 1 || ckpt_layout_.stages > 1)
    return false;
  const Experts experts = client_.expert_params ? *client_.expert_params : Experts{};
  if (!experts.empty() && checkpoint::moe_ep_size(model) != experts.begin()->second.ep_size)
    return false;
  // Which stage wrote it: ours say so; DeepSpeed's keep the optimizer here only at stage 0,
  // and write one model-states file per rank only at stage 3; at 1-2 the config it saved
  // (ds_config, where the program gave it as a dict) or else its ZeRO files tell.
  int saved_stage = 0;
  const PyValue* ds = model.find(PyValue("ds_config"));
  const PyValue* zo = ds && ds->is_dict() ? ds->find(PyValue("zero_optimization")) : nullptr;
  const PyValue* zs = zo && zo->is_dict() ? zo->find(PyValue("stage")) : nullptr;
  if (const PyValue* s = model.find(PyValue("dscpp_zero_stage"))) {
    saved_stage = static_cast<int>(s->as_int());
  } else if (!need(model, "optimizer", path).is_none()) {
    saved_stage = 0;
  } else if (path == checkpoint::zero_model_states_path(dir, tag, 0)) {
    saved_stage = 3;
  } else if (zs && zs->is_int()) {
    saved_stage = static_cast<int>(zs->as_int());
  } else {
    const std::string zpath = checkpoint::find_zero_states(dir, tag, 0);
    const PyValue z = checkpoint::load_torch_file(zpath);
    saved_stage = static_cast<int>(
        need(need(z, "optimizer_state_dict", zpath), "zero_stage", zpath).as_int());
  }
  if (saved_stage == zero_->stage()) return true;
  // Saved at another stage, the weights alone come from the module where it holds them.
  return options.load_module_only && saved_stage < 3 && zero_->stage() < 3;
}

void EngineCore::load_own_layout(const std::string& dir, const std::string& tag, PyValue model,
                                 const std::string& path, const LoadCheckpointOptions& options,
                                 LoadCheckpointResult& result, PyValue& settings) {
  // MoE (moe_checkpoint.h): the module gets this rank's experts from their files.
  const Experts experts = client_.expert_params ? *client_.expert_params : Experts{};
  model = moe_model_view(dir, tag, model, path, experts);
  // The experts' own ZeroOptimizer (ep_size > 1): loaded beside the dense one.
  EngineExperts* ex = this->experts();
  const bool other_params = load_module(model, path, options, result);
  if (options.load_module_only) {
    if (zero_->stage() >= 3 && !experts.empty()) {
      // At stage 3 the module takes no values: a MoE model's come from the partitions.
      load_zero_partitions(dir, tag, model, path, false);
    } else {
      refresh_masters_from_params();
    }
  } else if (other_params) {  // its partitions hold other parameters: the module's stand
    refresh_masters_from_params();
  } else if (zero_->stage() == 0) {
    load_stage0_optimizer(model, path, options.load_optimizer_states);
    if (ex) {
      // Its experts' optimizer: expp_rank_<ep rank>, after the dense parameters.
      const std::string expp = checkpoint::expp_optim_states_path(dir, tag, ex->ep_rank());
      load_stage0(ex->zero(), ex->names(),
                  need(checkpoint::load_torch_file(expp), "optimizer", expp), expp,
                  static_cast<int64_t>(muon_names_.size() + param_names_.size()),
                  options.load_optimizer_states);
    }
  } else {
    load_zero_partitions(dir, tag, model, path, options.load_optimizer_states, &settings);
  }
}

}  // namespace dscpp
