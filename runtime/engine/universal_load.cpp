// Universal checkpoints into ZeRO's partition: see universal_load.h.
#include "dscpp/runtime/engine/universal_load.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <memory>
#include <set>

#include "dscpp/runtime/checkpoint/ds_partition.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/moe_relayout.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"
#include "dscpp/runtime/checkpoint/universal.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"

namespace dscpp::engine_checkpoint {

std::map<std::string, checkpoint::ParamPartition> partitions_of(const checkpoint::PyValue& info) {
  std::map<std::string, checkpoint::ParamPartition> parts;
  const checkpoint::PyValue* pp =
      info.is_dict() ? info.find(checkpoint::PyValue("partitions")) : nullptr;
  if (!pp || !pp->is_dict()) throw CheckpointError("tensor-parallel metadata without 'partitions'");
  for (size_t i = 0; i < pp->size(); ++i)
    parts[pp->keys()[i].as_string()] =
        checkpoint::ParamPartition::from_py(pp->values()[i], pp->keys()[i].as_string());
  return parts;
}

WholeParams WholeParams::universal_folder(const std::string& tag_dir) {
  return {[tag_dir](const std::string& name, const std::vector<int64_t>& shape) {
            return checkpoint::read_universal_param(tag_dir, name, shape);
          },
          [tag_dir](const std::string& name) {
            return checkpoint::universal_param_dir(tag_dir, name);
          }};
}

WholeParams WholeParams::consolidated(std::vector<checkpoint::UniversalParam> params,
                                      const std::string& tag_dir) {
  auto by_name = std::make_shared<std::map<std::string, checkpoint::UniversalParam>>();
  for (auto& p : params) {
    std::string name = p.name;
    (*by_name)[name] = std::move(p);
  }
  auto where = [tag_dir](const std::string& name) {
    return fmt::format("checkpoint '{}', parameter '{}'", tag_dir, name);
  };
  return {[by_name, where](const std::string& name, const std::vector<int64_t>& shape) {
            auto it = by_name->find(name);
            if (it == by_name->end())
              throw CheckpointError(where(name) + ": no such parameter in the checkpoint");
            const at::Tensor& t = it->second.fp32;
            if (!t.defined() || t.sizes().vec() != shape)
              throw CheckpointError(fmt::format("{}: shape {} in the checkpoint, {} in the model",
                                                where(name), fmt::join(t.sizes(), "x"),
                                                fmt::join(shape, "x")));
            return it->second;
          },
          where};
}

void load_partition_by_name(zero::ZeroOptimizer& zero, const std::vector<std::string>& names,
                            const WholeParams& whole, bool load_optimizer_states,
                            const std::map<std::string, checkpoint::ParamPartition>* tp_parts,
                            int tp_rank) {
  if (names.size() != zero.layout().params.size())
    throw CheckpointError(fmt::format("load_checkpoint: {} parameter names for {} parameters",
                                      names.size(), zero.layout().params.size()));
  load_whole_params(
      zero,
      [&](size_t i) {
        const checkpoint::ParamPartition* part = nullptr;
        if (tp_parts) {
          auto it = tp_parts->find(names[i]);
          if (it != tp_parts->end() && it->second.partition_dim) part = &it->second;
        }
        if (!part) return whole.read(names[i], zero.param_shape(i));
        // A split parameter: the whole tensor, this rank's shard of it.
        checkpoint::UniversalParam p = whole.read(names[i], part->logical_shape);
        const std::string where = whole.where(names[i]);
        p.fp32 = checkpoint::tp_shard(p.fp32, *part, tp_rank, where);
        for (auto& [state, value] : p.states)
          value = checkpoint::tp_shard(value, *part, tp_rank, where);
        p.partition = checkpoint::ParamPartition::whole(p.fp32.sizes().vec());
        return p;
      },
      [&](size_t i) { return whole.where(names[i]); }, load_optimizer_states);
}

void load_experts_by_name(zero::ZeroOptimizer& zero, const std::vector<std::string>& names,
                          const std::map<std::string, nn::moe::ExpertParam>& experts,
                          const WholeParams& whole, bool load_optimizer_states) {
  if (names.size() != zero.layout().params.size())
    throw CheckpointError(
        fmt::format("load_checkpoint: {} expert parameter names for {} parameters", names.size(),
                    zero.layout().params.size()));
  // The one-rank model's parameters this rank's experts come from, read whole: a clone's
  // source is its global expert's (the slot's key is that expert's one-rank name), a stacked
  // weight's the one tensor [E, ...] of every expert of its layer.
  std::vector<checkpoint::UniversalParam> sources;
  std::set<std::string> read;
  for (size_t i = 0; i < names.size(); ++i) {
    auto e = experts.find(names[i]);
    if (e == experts.end())
      throw CheckpointError("load_checkpoint: '" + names[i] + "' is not an expert parameter");
    std::vector<int64_t> shape = zero.param_shape(i);
    std::string source = names[i];
    if (e->second.local_expert < 0) {
      shape.at(0) *= e->second.ep_size;
    } else {
      source = checkpoint::expert_slots(names[i], e->second).at(0).key;
    }
    if (read.insert(source).second) sources.push_back(whole.read(source, shape));
  }
  const std::string what = names.empty() ? "checkpoint" : whole.where(names.front());
  const checkpoint::ExpertRelayout relayout(what, std::move(sources),
                                            checkpoint::one_rank_experts(experts));
  load_whole_params(
      zero, [&](size_t i) { return relayout.param(names.at(i), experts); },
      [&](size_t i) { return whole.where(names.at(i)); }, load_optimizer_states);
}

void load_whole_params(zero::ZeroOptimizer& zero,
                       const std::function<checkpoint::UniversalParam(size_t)>& param,
                       const std::function<std::string(size_t)>& where,
                       bool load_optimizer_states) {
  const auto numels = numels_of(zero);
  // The whole model laid out flat in registration order is DeepSpeed's partition of one rank:
  // from_ds_partition then cuts out whatever this rank owns under our layout.
  const checkpoint::DsLayout whole = checkpoint::DsLayout::build(numels, 1);
  at::Tensor fp32 = at::empty({whole.total}, at::kFloat);
  std::map<std::string, at::Tensor> states;
  if (load_optimizer_states)
    for (const auto& s : zero.state_names()) states[s] = at::empty({whole.total}, at::kFloat);
  int64_t step = -1;
  std::string step_from;
  for (size_t i = 0; i < numels.size(); ++i) {
    checkpoint::UniversalParam p = param(i);
    const std::string pdir = where(i);
    const int64_t off = whole.offsets[i], n = numels[i];
    if (!p.fp32.defined()) throw CheckpointError("'" + pdir + "' has no fp32.pt");
    fp32.slice(0, off, off + n).copy_(p.fp32.reshape({-1}));
    if (!load_optimizer_states) continue;
    for (auto& [name, flat] : states) {
      auto it = p.states.find(name);
      if (it == p.states.end())
        throw CheckpointError(
            fmt::format("'{}' has no {}.pt, a state this engine's optimizer "
                        "keeps (load_optimizer_states=false starts it afresh)",
                        pdir, name));
      flat.slice(0, off, off + n).copy_(it->second.reshape({-1}));
    }
    if (!p.step.is_none()) {
      const int64_t s = step_of(p.step);
      if (step >= 0 && s != step)
        throw CheckpointError(
            fmt::format("'{}/step.pt' says step {}, '{}/step.pt' {}", pdir, s, step_from, step));
      step = s;
      step_from = pdir;
    }
  }
  const auto& layout = zero.layout();
  const int me = zero.layout_rank();
  at::Tensor master = zero.master_partition();
  checkpoint::from_ds_partition(layout, me, whole, 0, fp32, master);
  zero.set_master_partition(master);
  if (!load_optimizer_states) return;
  for (auto& [name, flat] : states) {
    at::Tensor part = zero.state_partition(name);
    checkpoint::from_ds_partition(layout, me, whole, 0, flat, part);
    zero.load_state_partition(name, part);
  }
  zero.set_step_count(step >= 0 ? step : 0);
}

}  // namespace dscpp::engine_checkpoint
