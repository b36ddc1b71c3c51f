// Tensor-parallel checkpoints (issue 19), Megatron-DeepSpeed's layout:
//   <tag>/mp_rank_XX_model_states.pt                       tensor rank XX's module shards,
//                                                          written by its data rank 0
//   <tag>/[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt  its data rank D's ZeRO partition
// mp_rank_00's model states carry `dscpp_tensor_parallel`: {tp_degree, data_parallel_size,
// partitions: {name: dscpp_partition}} (universal.h's ParamPartition, the metadata universal
// checkpoints write). Loading reads every tensor rank's files, merges each tensor's shards along
// its partition dimension and cuts this engine's (runtime/checkpoint/tp_reshape.h): a
// checkpoint saved at (t, d) loads at any (t', d') at ZeRO stages 0-2, and into the plain
// one-rank engine (t' = 1), optimizer state with the weights.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <map>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/universal_load.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;

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
  PyValue parts = PyValue::dict();
  for (const auto& [name, p] : named_params_()) {
    auto it = tp_attrs_->find(name);
    const nn::TensorParallelAttr a = it == tp_attrs_->end() ? nn::TensorParallelAttr{} : it->second;
    std::vector<int64_t> logical = p.sizes().vec();
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
  l.model_states_path = [r, t](const std::string& dir, const std::string& tag) {
    return checkpoint::pipe_model_states_path(dir, tag, 0, r, t);
  };
  l.zero_states_path = [r, t](const std::string& dir, const std::string& tag, int dp, bool bf16) {
    return checkpoint::pipe_zero_states_path(dir, tag, dp, 0, r, t, bf16);
  };
  l.before_model_states = [this](const std::string&, const std::string&, PyValue& model) {
    if (zero_->stage() >= 3)
      throw CheckpointError(
          "save_checkpoint: tensor-parallel checkpoints at ZeRO stage 3 are not implemented "
          "yet (stages 0-2 are)");
    model.set("dscpp_tensor_parallel", tensor_parallel_info());
  };
  ckpt_layout_ = std::move(l);
}

void EngineCore::load_tp_checkpoint(const std::string& dir, const std::string& tag,
                                    const PyValue& model0, const std::string& path0,
                                    const LoadCheckpointOptions& options,
                                    LoadCheckpointResult& result, PyValue& rng) {
  if (zero_->stage() >= 3)
    throw CheckpointError("'" + path0 +
                          "' is a tensor-parallel checkpoint: it loads at ZeRO stages 0-2, this "
                          "engine runs stage 3");
  const PyValue& info = engine_checkpoint::need(model0, "dscpp_tensor_parallel", path0);
  const int saved_t = static_cast<int>(info.at(PyValue("tp_degree")).as_int());
  const int64_t saved_d = info.at(PyValue("data_parallel_size")).as_int();
  std::map<std::string, checkpoint::ParamPartition> parts;
  const PyValue& pp = info.at(PyValue("partitions"));
  for (size_t i = 0; i < pp.size(); ++i)
    parts[pp.keys()[i].as_string()] = checkpoint::ParamPartition::from_py(
        pp.values()[i], path0 + ": " + pp.keys()[i].as_string());
  // Every tensor rank's model states and whole (data-consolidated) parameters.
  std::vector<PyValue> models;
  std::vector<std::map<std::string, checkpoint::UniversalParam>> params(saved_t);
  for (int r = 0; r < saved_t; ++r) {
    const std::string path = checkpoint::pipe_model_states_path(dir, tag, 0, r, saved_t);
    models.push_back(r == 0 ? model0 : checkpoint::load_torch_file(path));
    if (options.load_module_only) continue;
    for (auto& p : checkpoint::consolidate_params(
             models[r], path, engine_checkpoint::need(models[r], "module", path),
             [&](int dp) { return zero_file_of(dir, tag, dp, r, saved_t); }))
      params[r][p.name] = std::move(p);
  }
  const int t = tensor_parallel_size(), me = tensor_parallel_rank();
  // One tensor's shards (tensor-rank order) merged, and this engine's cut.
  auto cut = [&](const std::string& name, const std::vector<at::Tensor>& shards) {
    auto it = parts.find(name);
    if (it == parts.end()) return shards.at(0);  // not a parameter (a buffer): replicated
    const at::Tensor whole = checkpoint::merge_tp_shards(shards, it->second, name);
    return checkpoint::tp_shard(whole, checkpoint::at_tp_degree(it->second, t), me, name);
  };
  const PyValue& module0 = engine_checkpoint::need(model0, "module", path0);
  PyValue module = PyValue::ordered_dict();
  for (size_t i = 0; i < module0.size(); ++i) {
    const std::string name = module0.keys()[i].as_string();
    if (!module0.values()[i].is_tensor()) {
      module.set(module0.keys()[i], module0.values()[i]);
      continue;
    }
    std::vector<at::Tensor> shards;
    for (int r = 0; r < saved_t; ++r)
      shards.push_back(models[r].at(PyValue("module")).at(PyValue(name)).as_tensor());
    module.set(module0.keys()[i], PyValue(cut(name, shards)));
  }
  PyValue view = model0;
  view.set(PyValue("module"), std::move(module));
  const bool other_params = load_module(view, path0, options, result);
  if (options.load_module_only || other_params) {
    zero_->refresh_master_from_params();
  } else {
    const std::string where = checkpoint::tag_dir(dir, tag);
    engine_checkpoint::load_whole_params(
        *zero_,
        [&](size_t i) {
          const std::string& name = param_names_.at(i);
          std::vector<const checkpoint::UniversalParam*> of;
          for (int r = 0; r < saved_t; ++r) {
            auto it = params[r].find(name);
            if (it == params[r].end())
              throw CheckpointError(
                  fmt::format("tensor-parallel checkpoint '{}': tensor rank {} "
                              "has no parameter '{}'",
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
          return u;
        },
        [&](size_t i) {
          return fmt::format("tensor-parallel checkpoint '{}': parameter '{}'", where,
                             param_names_[i]);
        },
        options.load_optimizer_states);
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
