// Tensor-parallel checkpoints, Megatron-DeepSpeed's layout (docs/checkpoints.md):
//   <tag>/mp_rank_XX_model_states.pt                       tensor rank XX's module shards,
//                                                          written by its data rank 0
//   <tag>/[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt  its data rank D's ZeRO partition
// mp_rank_00's model states carry `dscpp_tensor_parallel`: {tp_degree, data_parallel_size,
// partitions: {name: dscpp_partition}} (universal.h's ParamPartition, the metadata universal
// checkpoints write). Loading reads every tensor rank's files, merges each tensor's shards along
// its partition dimension and cuts this engine's (runtime/checkpoint/tp_reshape.h): a
// checkpoint saved at (t, d) loads at any (t', d') and ZeRO stage, and into the plain one-rank
// engine (t' = 1), optimizer state with the weights. At stage 3 the layout stays the same (one
// mp_rank_XX model-states file per tensor rank, not DeepSpeed's per-rank stage-3 files): its
// module holds the buffers only, as a stage-3 file does, and the parameters' values come from
// the ZeRO files, consolidated and cut as the other stages' are.
// With experts, DeepSpeed's MoE layout per tensor rank XX (its _get_expert_ckpt_name
// takes the model-parallel rank): layer_L_expert_E_mp_rank_XX_model_states.pt per global
// expert, written by tensor rank XX's expert-data rank 0 (the experts are replicated over the
// tensor group, so every XX holds the same values), at ZeRO 0 expp_rank_R_mp_rank_XX, and the
// experts' ZeRO group (ep_size > 1) in zero_pp_rank_D_mp_rank_XX beside the dense one. Loading
// reads each tensor rank's part as the one-rank model's (moe_pipe_stage.h) and cuts this
// engine's experts per global expert: any expert-parallel degree and tensor degree, ZeRO 0-2.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/moe_pipe_stage.h"
#include "dscpp/runtime/checkpoint/moe_relayout.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/moe_checkpoint.h"
#include "dscpp/runtime/engine/universal_load.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;
using engine_checkpoint::Experts;

namespace {
std::string zero_file_of(const std::string& dir, const std::string& tag, int dp, int mp, int t) {
  for (bool bf16 : {false, true}) {
    const std::string p = checkpoint::pipe_zero_states_path(dir, tag, dp, 0, mp, t, bf16);
    if (std::filesystem::is_regular_file(p)) return p;
  }
  throw CheckpointError(
      fmt::format("tensor-parallel checkpoint '{}': no ZeRO file of data rank {} "
                  "and tensor rank {} (expected {})",
                  checkpoint::tag_dir(dir, tag), dp, mp,
                  checkpoint::pipe_zero_states_path(dir, tag, dp, 0, mp, t, false)));
}
}  // namespace

PyValue EngineCore::tensor_parallel_info() {
  const int t = tensor_parallel_size();
  // ZeRO's shapes: at stage 3 the parameters are empty at rest.
  std::map<std::string, std::vector<int64_t>> shape_of;
  for (size_t i = 0; i < param_names_.size(); ++i)
    shape_of[param_names_[i]] = zero_->param_shape(i);
  for (const auto& [alias, name] : shared_params_)
    if (auto it = shape_of.find(name); it != shape_of.end()) shape_of[alias] = it->second;
  PyValue parts = PyValue::dict();
  for (const auto& [name, p] : named_params_()) {
    // Experts are replicated over the tensor group and saved per global expert in files of
    // their own (moe_layout.h): no tensor-parallel partition.
    if (client_.expert_params && client_.expert_params->count(name)) continue;
    auto it = tp_attrs_->find(name);
    const nn::TensorParallelAttr a = it == tp_attrs_->end() ? nn::TensorParallelAttr{} : it->second;
    const auto shape = shape_of.find(name);
    std::vector<int64_t> logical = shape != shape_of.end() ? shape->second : p.sizes().vec();
    std::optional<int64_t> dim;
    if (a.tensor_model_parallel) {
      dim = a.partition_dim;
      logical.at(a.partition_dim) *= t;
    }
    parts.set(name,
              checkpoint::tensor_parallel_partition(logical, t, dim, a.partition_stride).to_py());
  }
  PyValue info = PyValue::dict();
  info.set("tp_degree", PyValue(static_cast<int64_t>(t)));
  info.set("data_parallel_size", PyValue(static_cast<int64_t>(group_->size())));
  info.set("partitions", std::move(parts));
  return info;
}

void EngineCore::use_tensor_parallel_layout() {
  const int t = tensor_parallel_size(), r = tensor_parallel_rank();
  CheckpointLayout l;
  l.world = comm::init_distributed();  // agreement, tags and `latest` over every rank
  l.mp_rank = r;  // DeepSpeed's expert files: layer_L_expert_E_mp_rank_<tensor rank>
  l.model_states_path = [r, t](const std::string& dir, const std::string& tag) {
    return checkpoint::pipe_model_states_path(dir, tag, 0, r, t);
  };
  l.zero_states_path = [r, t](const std::string& dir, const std::string& tag, int dp, bool bf16) {
    return checkpoint::pipe_zero_states_path(dir, tag, dp, 0, r, t, bf16);
  };
  l.before_model_states = [this](const std::string&, const std::string&, PyValue& model) {
    model.set("dscpp_tensor_parallel", tensor_parallel_info());
  };
  ckpt_layout_ = std::move(l);
}

void EngineCore::load_tp_checkpoint(const std::string& dir, const std::string& tag,
                                    const PyValue& model0, const std::string& path0,
                                    const LoadCheckpointOptions& options,
                                    LoadCheckpointResult& result, PyValue& rng) {
  const PyValue& info = engine_checkpoint::need(model0, "dscpp_tensor_parallel", path0);
  const int saved_t = static_cast<int>(info.at(PyValue("tp_degree")).as_int());
  const int64_t saved_d = info.at(PyValue("data_parallel_size")).as_int();
  std::map<std::string, checkpoint::ParamPartition> parts;
  const PyValue& pp = info.at(PyValue("partitions"));
  for (size_t i = 0; i < pp.size(); ++i)
    parts[pp.keys()[i].as_string()] = checkpoint::ParamPartition::from_py(
        pp.values()[i], path0 + ": " + pp.keys()[i].as_string());
  // Stage 3 on either side: the parameters' values go through the ZeRO files (a stage-3
  // module holds none, and a stage-3 engine takes them into its partition only).
  const PyValue* stage_v = model0.find(PyValue("dscpp_zero_stage"));
  const bool saved3 = stage_v && stage_v->as_int() >= 3, here3 = zero_->stage() >= 3;
  const bool whole_params = !options.load_module_only || saved3 || here3;
  // Experts (DeepSpeed's MoE layout per tensor rank: its module without them, its experts in
  // layer_L_expert_E_mp_rank_<r>, their ZeRO group in its zero_pp_rank_D_mp_rank_<r> files):
  // each tensor rank's part read as the one-rank model's, every global expert a local one
  // (moe_pipe_stage.h, as a pipeline stage's), then this engine's experts cut from it per
  // global expert (moe_relayout.h), whatever expert-parallel degree saved it. The experts are
  // replicated over the tensor group: tensor rank 0's are taken.
  const Experts experts = client_.expert_params ? *client_.expert_params : Experts{};
  const bool moe = model0.contains(PyValue("num_experts"));
  if (moe && (saved3 || here3))
    throw CheckpointError(fmt::format(
        "'{}': a MoE checkpoint with tensor parallelism loads at ZeRO stages 0-2, this engine "
        "runs stage {}",
        path0, zero_->stage()));
  // Every tensor rank's model states and whole (data-consolidated) parameters.
  std::vector<PyValue> models;
  std::vector<std::map<std::string, checkpoint::UniversalParam>> params(saved_t);
  std::vector<std::string> saved_names;  // the trainable parameters, in rank 0's order
  for (int r = 0; r < saved_t; ++r) {
    const std::string path = checkpoint::pipe_model_states_path(dir, tag, 0, r, saved_t);
    models.push_back(r == 0 ? model0 : checkpoint::load_torch_file(path));
    if (moe) {
      checkpoint::PipeMoeStage part(dir, tag, models[r], path, r,
                                    [&](int dp) { return zero_file_of(dir, tag, dp, r, saved_t); });
      models[r].set(PyValue("module"), std::move(part.module));
      for (auto& p : part.params) {  // (at ep 1 the experts are listed twice: dense and expert)
        if (r == 0 && !params[r].count(p.name)) saved_names.push_back(p.name);
        params[r][p.name] = std::move(p);
      }
      continue;
    }
    if (!whole_params) continue;
    for (auto& p : checkpoint::consolidate_params(
             models[r], path, engine_checkpoint::need(models[r], "module", path),
             [&](int dp) { return zero_file_of(dir, tag, dp, r, saved_t); })) {
      if (r == 0) saved_names.push_back(p.name);
      params[r][p.name] = std::move(p);
    }
  }
  const int t = tensor_parallel_size(), me = tensor_parallel_rank();
  // One tensor's shards (tensor-rank order) merged, and this engine's cut.
  auto cut = [&](const std::string& name, const std::vector<at::Tensor>& shards) {
    auto it = parts.find(name);
    if (it == parts.end()) return shards.at(0);  // not a parameter (a buffer): replicated
    const at::Tensor whole = checkpoint::merge_tp_shards(shards, it->second, name);
    return checkpoint::tp_shard(whole, checkpoint::at_tp_degree(it->second, t), me, name);
  };
  const std::string where = checkpoint::tag_dir(dir, tag);
  // This engine's cut of one trainable parameter of the checkpoint, optimizer states with it.
  std::map<std::string, checkpoint::UniversalParam> mine;
  auto mine_of = [&](const std::string& name) -> const checkpoint::UniversalParam& {
    if (auto it = mine.find(name); it != mine.end()) return it->second;
    std::vector<const checkpoint::UniversalParam*> of;
    for (int r = 0; r < saved_t; ++r) {
      auto it = params[r].find(name);
      if (it == params[r].end())
        throw CheckpointError(
            fmt::format("tensor-parallel checkpoint '{}': tensor rank {} has no parameter '{}'",
                        where, r, name));
      of.push_back(&it->second);
    }
    checkpoint::UniversalParam u;
    u.name = name;
    std::vector<at::Tensor> shards;
    for (const auto* p : of) shards.push_back(p->fp32);
    u.fp32 = cut(name, shards);
    for (const auto& [state, value] : of[0]->states) {
      std::vector<at::Tensor> s;
      for (const auto* p : of) s.push_back(p->states.at(state));
      u.states[state] = cut(name, s);
    }
    u.step = of[0]->step;
    u.partition = checkpoint::ParamPartition::whole(u.fp32.sizes().vec());
    return mine.emplace(name, std::move(u)).first->second;
  };
  // The view load_module reads: this engine's cut of every tensor. A stage-3 engine takes
  // from `module` only what ZeRO does not hold, and checks param_shapes against its own.
  std::set<std::string> partitioned(param_names_.begin(), param_names_.end());
  for (const auto& [alias, name] : shared_params_) partitioned.insert(alias);
  const PyValue& module0 = engine_checkpoint::need(models[0], "module", path0);
  PyValue module = PyValue::ordered_dict();
  for (size_t i = 0; i < module0.size(); ++i) {
    const std::string name = module0.keys()[i].as_string();
    if (!module0.values()[i].is_tensor()) {
      module.set(module0.keys()[i], module0.values()[i]);
      continue;
    }
    if (here3 && partitioned.count(name)) continue;
    std::vector<at::Tensor> shards;
    for (int r = 0; r < saved_t; ++r)
      shards.push_back(models[r].at(PyValue("module")).at(PyValue(name)).as_tensor());
    module.set(module0.keys()[i], PyValue(cut(name, shards)));
  }
  // A MoE checkpoint: the module and the parameters under this engine's expert names.
  std::optional<checkpoint::ExpertRelayout> relayout;
  if (moe) {
    module = checkpoint::module_at_experts(module, experts,
                                           fmt::format("tensor-parallel checkpoint '{}'", where));
    std::vector<checkpoint::UniversalParam> whole;
    for (const auto& name : saved_names) whole.push_back(mine_of(name));
    relayout.emplace(where, std::move(whole), checkpoint::one_rank_experts(experts));
  }
  auto param_of = [&](const std::string& name) {
    return relayout ? relayout->param(name, experts) : mine_of(name);
  };
  PyValue view = model0;
  if (saved3 && !here3) {
    // The stage-3 module lacks the trainable parameters and their other names: the
    // consolidated fp32 values stand in (load_module casts them).
    for (const auto& name : saved_names) module.set(PyValue(name), PyValue(mine_of(name).fp32));
    if (const PyValue* shared = model0.find(PyValue("shared_params")); shared && shared->is_dict())
      for (size_t i = 0; i < shared->size(); ++i)
        if (const PyValue* src = module.find(shared->values()[i]))
          module.set(shared->keys()[i], PyValue(*src));
  }
  if (here3) {
    PyValue shapes = PyValue::ordered_dict();
    for (const auto& name : saved_names)
      shapes.set(PyValue(name), PyValue::size(mine_of(name).fp32.sizes().vec()));
    view.set(PyValue("param_shapes"), PyValue::list({std::move(shapes)}));
  }
  view.set(PyValue("module"), std::move(module));
  const bool other_params = load_module(view, path0, options, result);
  auto load_params = [&](bool optimizer_states) {
    auto load = [&](zero::ZeroOptimizer& z, const std::vector<std::string>& names) {
      engine_checkpoint::load_whole_params(
          z, [&](size_t i) { return param_of(names.at(i)); },
          [&](size_t i) {
            return fmt::format("tensor-parallel checkpoint '{}': parameter '{}'", where,
                               names.at(i));
          },
          optimizer_states);
    };
    for (const auto& p : zero_set_) load(*p.zero, *p.names);
  };
  if (here3) {  // (other parameters were refused by load_module at stage 3)
    load_params(options.load_optimizer_states && !options.load_module_only);
  } else if (options.load_module_only || other_params) {
    refresh_masters_from_params();
  } else {
    load_params(options.load_optimizer_states);
  }
  if (options.load_module_only) return;
  load_engine_counters(model0, path0, options);
  // The RNG states belong to the saved ranks: restored only on the same layout.
  if (saved_t == t && saved_d == group_->size()) {
    if (const PyValue* r = models.at(me).find(PyValue("dscpp_rng_states"))) rng = *r;
  } else if (ckpt_group().rank() == 0) {
    std::cerr << fmt::format(
        "dscpp: the checkpoint was saved on tensor {} x data {} ranks, this run has {} x {}: "
        "its random-number states are not restored\n",
        saved_t, saved_d, t, group_->size());
  }
}

}  // namespace dscpp
