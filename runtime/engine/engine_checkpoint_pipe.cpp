// EngineCore::load_pipe_checkpoint: a pipeline checkpoint (runtime/checkpoint/pipe_checkpoint.h)
// into this engine, whatever layout saved it: the module from the layer files (a pipeline stage
// takes its own layers' part), and each trainable parameter's fp32 weights and optimizer state
// whole, cut into this rank's ZeRO partition as a universal checkpoint's are. So a pipeline
// engine loads onto other numbers of stages and data ranks, and the plain engine on the whole
// model loads a pipeline checkpoint. A 3D checkpoint (model axis) is read whole too and this
// engine's tensor-parallel shard cut from it, so it loads at any (t, p, d).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <map>
#include <set>

#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/moe_relayout.h"
#include "dscpp/runtime/checkpoint/pipe_checkpoint.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/engine_experts.h"
#include "dscpp/runtime/engine/moe_checkpoint.h"
#include "dscpp/runtime/engine/universal_load.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;
using engine_checkpoint::Experts;

void EngineCore::load_pipe_checkpoint(const std::string& dir, const std::string& tag,
                                      const PyValue& model, const std::string& path,
                                      const LoadCheckpointOptions& options,
                                      LoadCheckpointResult& result, PyValue& rng) {
  if (zero_->stage() >= 3)
    throw CheckpointError("'" + path +
                          "' is a pipeline checkpoint: it loads at ZeRO stages 0-2, this engine "
                          "runs stage 3");
  checkpoint::PipeCheckpoint ck = checkpoint::read_pipe_checkpoint(dir, tag);
  // The checkpoint is whole (its tensor-parallel shards merged): a tensor-parallel engine takes
  // its own shard of each split tensor, by its own partition metadata (tp_reshape.h).
  const int t = tensor_parallel_size(), me = tensor_parallel_rank();
  if (t > 1) {
    const auto parts = engine_checkpoint::partitions_of(tensor_parallel_info());
    auto cut = [&](const std::string& name, const at::Tensor& whole) {
      auto it = parts.find(name);
      if (it == parts.end() || !it->second.partition_dim) return whole;
      return checkpoint::tp_shard(whole, it->second, me,
                                  "pipeline checkpoint '" + path + "': " + name);
    };
    for (size_t i = 0; i < ck.module.size(); ++i)
      if (ck.module.values()[i].is_tensor())
        ck.module.set(ck.module.keys()[i], PyValue(cut(ck.module.keys()[i].as_string(),
                                                       ck.module.values()[i].as_tensor())));
    for (auto& p : ck.params) {
      p.fp32 = cut(p.name, p.fp32);
      for (auto& [state, value] : p.states) value = cut(p.name, value);
      p.partition = checkpoint::ParamPartition::whole(p.fp32.sizes().vec());
    }
  }
  // The checkpoint is the one-rank model's (every global expert): this engine's experts, at
  // its own expert-parallel degree and rank, are cut from it per global expert (moe_layout.h's
  // slots), whatever degree saved it.
  const Experts experts = client_.expert_params ? *client_.expert_params : Experts{};
  const Experts one = checkpoint::one_rank_experts(experts);
  const std::string where = checkpoint::tag_dir(dir, tag);
  // The module: the whole model's state dict, or (a pipeline stage) the part this engine holds.
  const PyValue local = checkpoint::module_at_experts(
      ck.module, experts, fmt::format("pipeline checkpoint '{}'", where));
  PyValue module = PyValue::ordered_dict();
  std::set<std::string> ours;
  for (const auto& [name, t] : named_params_()) ours.insert(name);
  for (const auto& [name, t] : named_buffers_()) ours.insert(name);
  for (size_t i = 0; i < local.size(); ++i)
    if (!ckpt_layout_.partial_module || ours.count(local.keys()[i].as_string()))
      module.set(local.keys()[i], local.values()[i]);
  PyValue view = model;
  view.set(PyValue("module"), std::move(module));
  const bool other_params = load_module(view, path, options, result);
  EngineExperts* ex = this->experts();
  if (options.load_module_only || other_params) {
    refresh_masters_from_params();
  } else {
    std::map<std::string, const checkpoint::UniversalParam*> by_name;
    for (const auto& p : ck.params) by_name[p.name] = &p;
    if (ex) {
      // The experts' own ZeroOptimizer (ep_size > 1): each local expert's weights and
      // optimizer state cut from the whole ones.
      const checkpoint::ExpertRelayout relayout(where, ck.params, one);
      const auto& names = ex->names();
      engine_checkpoint::load_whole_params(
          ex->zero(), [&](size_t i) { return relayout.param(names.at(i), experts); },
          [&](size_t i) {
            return fmt::format("pipeline checkpoint '{}': expert parameter '{}'", where,
                               names.at(i));
          },
          options.load_optimizer_states);
    }
    engine_checkpoint::load_whole_params(
        *zero_,
        [&](size_t i) {
          auto it = by_name.find(param_names_.at(i));
          if (it == by_name.end())
            throw CheckpointError(fmt::format(
                "pipeline checkpoint '{}': no stage's model states list the parameter '{}' "
                "(param_shapes of {})",
                where, param_names_[i], engine_checkpoint::list_names(ck.model_paths)));
          if (it->second->partition.logical_shape != zero_->param_shape(i))
            throw CheckpointError(fmt::format(
                "pipeline checkpoint '{}': parameter '{}' is {} there, {} in this model", where,
                param_names_[i], fmt::join(it->second->partition.logical_shape, "x"),
                fmt::join(zero_->param_shape(i), "x")));
          return *it->second;
        },
        [&](size_t i) {
          return fmt::format("pipeline checkpoint '{}': parameter '{}'", where, param_names_[i]);
        },
        options.load_optimizer_states);
  }
  if (options.load_module_only) return;
  load_engine_counters(model, path, options);
  // Each stage's model states hold the RNG states of its data ranks: this run's only when it
  // has the saved layout.
  if (ck.stages == ckpt_layout_.stages && ck.data_parallel_size == group_->size() &&
      ck.model_parallel_size == t) {
    if (const PyValue* r = ck.models.at(static_cast<size_t>(ckpt_layout_.stage * t + me))
                               .find(PyValue("dscpp_rng_states")))
      rng = *r;
  } else if (ckpt_group().rank() == 0) {
    std::cerr << fmt::format(
        "dscpp: the pipeline checkpoint was saved on {} stages x {} data ranks x {} model "
        "ranks, this run has {} x {} x {}: its random-number states are not restored\n",
        ck.stages, ck.data_parallel_size, ck.model_parallel_size, ckpt_layout_.stages,
        group_->size(), t);
  }
}

}  // namespace dscpp
