// A MoE checkpoint as whole tensors by global key: see moe_relayout.h.
#include "dscpp/runtime/checkpoint/moe_relayout.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <functional>
#include <vector>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/py_dict.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"

namespace dscpp::checkpoint {

using detail::need;

void ExpertRelayout::add(UniversalParam p,
                         const std::map<std::string, nn::moe::ExpertParam>& experts) {
  auto e = experts.find(p.name);
  if (e == experts.end()) {
    by_key_[p.name] = std::move(p);
    return;
  }
  for (const auto& slot : expert_slots(p.name, e->second)) {
    auto cut = [&](const at::Tensor& t) {
      return slot.slice < 0 ? t : t.select(0, slot.slice).contiguous();
    };
    UniversalParam q;
    q.name = slot.key;
    q.fp32 = cut(p.fp32);
    for (const auto& [s, t] : p.states) q.states[s] = cut(t);
    q.step = p.step;
    q.partition = ParamPartition::whole(q.fp32.sizes().vec());
    by_key_[slot.key] = std::move(q);
  }
}

ExpertRelayout::ExpertRelayout(std::string where, std::vector<UniversalParam> whole,
                               const std::map<std::string, nn::moe::ExpertParam>& one_rank)
    : where_(std::move(where)) {
  for (auto& p : whole) add(std::move(p), one_rank);
}

ExpertRelayout::ExpertRelayout(const std::string& dir, const std::string& tag, const PyValue& model,
                               const std::string& path, int mp_rank,
                               std::function<std::string(int)> zero_file)
    : where_(tag_dir(dir, tag)) {
  const auto saved = experts_of_info(model, path);
  const int64_t ep = moe_ep_size(model);
  auto files = ExpertFiles::of_model(dir, tag, model, path, mp_rank);
  const PyValue& module = need(model, "module", path);
  if (!zero_file) zero_file = [&](int r) { return find_zero_states(dir, tag, r); };
  if (ep == 1) {
    // Every rank held every expert, in the one (dense) group: the saving ranks' view is the
    // one-rank model's.
    const PyValue whole = module_with_experts(module, saved, files);
    PyValue view = model;
    view.set(PyValue("module"), whole);
    for (auto& p : consolidate_params(view, path, whole, zero_file)) add(std::move(p), saved);
    return;
  }
  const int world = static_cast<int>(need(model, "dp_world_size", path).as_int());
  if (world % ep != 0)
    throw CheckpointError(
        fmt::format("'{}': dp_world_size {} is not a multiple of ep_size {}", path, world, ep));
  // The dense groups (one, or Muon's two halves), then the experts' (the last).
  const size_t groups = param_groups_of(model, path);
  for (size_t g = 0; g + 1 < groups; ++g) {
    ZeroGroup dense;
    dense.group = g;
    for (auto& p : consolidate_params(model, path, module, zero_file, nullptr, dense))
      add(std::move(p), {});
  }
  const bool stage0 = !need(model, "optimizer", path).is_none();
  for (int64_t r = 0; r < ep; ++r) {
    // Expert-parallel rank r's experts, under its local names.
    std::map<std::string, nn::moe::ExpertParam> mine = saved;
    for (auto& [name, e] : mine) e.ep_rank = r;
    const PyValue local = module_with_experts(PyValue::ordered_dict(), mine, files);
    PyValue expp;
    if (stage0) {
      const std::string expp_path = expp_optim_states_path(dir, tag, static_cast<int>(r), mp_rank);
      expp = need(load_torch_file(expp_path), "optimizer", expp_path);
    }
    ZeroGroup which;
    which.group = groups - 1;
    which.partitions = static_cast<int>(world / ep);
    which.rank_of = [&](int k) { return static_cast<int>(k * ep + r); };
    which.stage0_optimizer = stage0 ? &expp : nullptr;
    for (auto& p : consolidate_params(model, path, local, zero_file, nullptr, which))
      add(std::move(p), mine);
  }
}

UniversalParam ExpertRelayout::param(
    const std::string& name, const std::map<std::string, nn::moe::ExpertParam>& experts) const {
  auto find = [&](const std::string& key) -> const UniversalParam& {
    auto it = by_key_.find(key);
    if (it == by_key_.end())
      throw CheckpointError(fmt::format(
          "MoE checkpoint '{}' holds no parameter '{}' (needed for '{}')", where_, key, name));
    return it->second;
  };
  auto e = experts.find(name);
  if (e == experts.end()) return find(name);
  const auto slots = expert_slots(name, e->second);
  UniversalParam out;
  if (e->second.local_expert >= 0) {
    out = find(slots.at(0).key);
  } else {
    std::vector<const UniversalParam*> parts;
    for (const auto& s : slots) parts.push_back(&find(s.key));
    auto stack = [&](const std::function<at::Tensor(const UniversalParam&)>& of) {
      std::vector<at::Tensor> ts;
      for (const auto* p : parts) ts.push_back(of(*p));
      return at::stack(ts);
    };
    out.fp32 = stack([](const UniversalParam& p) { return p.fp32; });
    for (const auto& entry : parts[0]->states) {
      const std::string& s = entry.first;
      out.states[s] = stack([&](const UniversalParam& p) {
        auto it = p.states.find(s);
        if (it == p.states.end())
          throw CheckpointError(
              fmt::format("MoE checkpoint '{}': '{}' has no {}", where_, p.name, s));
        return it->second;
      });
    }
    out.step = parts[0]->step;
  }
  out.name = name;
  out.partition = ParamPartition::whole(out.fp32.sizes().vec());
  return out;
}

}  // namespace dscpp::checkpoint
