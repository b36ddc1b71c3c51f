// DeepSpeed's MoE checkpoint layout: see moe_layout.h.
#include "dscpp/runtime/checkpoint/moe_layout.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <set>

#include "dscpp/runtime/checkpoint/ds_layout.h"

namespace dscpp::checkpoint {

namespace {
constexpr const char* kClones = "deepspeed_experts.";
}  // namespace

std::string expert_states_path(const std::string& dir, const std::string& tag, int layer,
                               int64_t global_expert, int mp_rank) {
  return (std::filesystem::path(tag_dir(dir, tag)) /
          fmt::format("layer_{}_expert_{}_mp_rank_{:02d}_model_states.pt", layer, global_expert,
                      mp_rank))
      .string();
}

std::string expp_optim_states_path(const std::string& dir, const std::string& tag, int expp_rank,
                                   int mp_rank) {
  return (std::filesystem::path(tag_dir(dir, tag)) /
          fmt::format("expp_rank_{}_mp_rank_{:02d}_optim_states.pt", expp_rank, mp_rank))
      .string();
}

std::vector<ExpertSlot> expert_slots(const std::string& name, const nn::moe::ExpertParam& e) {
  const int64_t first = e.ep_rank * e.num_local_experts;
  if (e.local_expert < 0) {  // stacked: AutoEP's "<fused key>.<global id>" per expert
    std::vector<ExpertSlot> out;
    for (int64_t j = 0; j < e.num_local_experts; ++j)
      out.push_back({e.moe_layer, first + j, fmt::format("{}.{}", name, first + j), j});
    return out;
  }
  // A clone: "...deepspeed_experts.<local>.<rest>" with the global id in place of the local.
  const std::string local = kClones + std::to_string(e.local_expert) + ".";
  const size_t at = name.rfind(local);
  if (at == std::string::npos)
    throw CheckpointError(
        fmt::format("expert parameter '{}' is not named {}<expert>.<name>", name, kClones));
  const int64_t global = first + e.local_expert;
  std::string key =
      name.substr(0, at) + kClones + std::to_string(global) + "." + name.substr(at + local.size());
  return {{e.moe_layer, global, std::move(key), -1}};
}

std::vector<int64_t> num_experts_per_layer(
    const std::map<std::string, nn::moe::ExpertParam>& experts) {
  std::vector<int64_t> out;
  for (const auto& [name, e] : experts) {
    if (static_cast<size_t>(e.moe_layer) >= out.size()) out.resize(e.moe_layer + 1, 0);
    out[e.moe_layer] = e.num_local_experts * e.ep_size;
  }
  return out;
}

PyValue moe_info(const std::map<std::string, nn::moe::ExpertParam>& experts) {
  int64_t ep = 1;
  PyValue params = PyValue::dict();
  for (const auto& [name, e] : experts) {
    ep = e.ep_size;
    PyValue p = PyValue::dict();
    p.set("layer", PyValue(e.moe_layer));
    p.set("local_expert", PyValue(e.local_expert));
    p.set("num_local_experts", PyValue(e.num_local_experts));
    params.set(PyValue(name), std::move(p));
  }
  PyValue info = PyValue::dict();
  info.set("ep_size", PyValue(ep));
  info.set("expert_params", std::move(params));
  return info;
}

int64_t moe_ep_size(const PyValue& model) {
  const PyValue* info = model.is_dict() ? model.find(PyValue("dscpp_moe")) : nullptr;
  return info && info->is_dict() ? info->at(PyValue("ep_size")).as_int() : 1;
}

std::map<std::string, nn::moe::ExpertParam> experts_of_info(const PyValue& model,
                                                            const std::string& path) {
  const PyValue* info = model.is_dict() ? model.find(PyValue("dscpp_moe")) : nullptr;
  if (!info || !info->is_dict())
    throw CheckpointError("'" + path +
                          "' has no 'dscpp_moe' entry: a MoE checkpoint not written by dscpp "
                          "(its expert parameters' local names are not recorded)");
  std::map<std::string, nn::moe::ExpertParam> out;
  const int64_t ep = info->at(PyValue("ep_size")).as_int();
  const PyValue& params = info->at(PyValue("expert_params"));
  for (size_t i = 0; i < params.size(); ++i) {
    const PyValue& p = params.values()[i];
    nn::moe::ExpertParam e;
    e.moe_layer = static_cast<int>(p.at(PyValue("layer")).as_int());
    e.local_expert = static_cast<int>(p.at(PyValue("local_expert")).as_int());
    e.num_local_experts = p.at(PyValue("num_local_experts")).as_int();
    e.ep_size = ep;
    out.emplace(params.keys()[i].as_string(), e);
  }
  return out;
}

void save_expert_files(const std::string& dir, const std::string& tag,
                       const std::map<std::string, nn::moe::ExpertParam>& experts,
                       const std::function<at::Tensor(const std::string&)>& value, int mp_rank) {
  // Per file, its tensors in the module's order (the map is by name; DeepSpeed's files list
  // an expert's tensors in state_dict order, which no reader depends on).
  std::map<std::pair<int, int64_t>, PyValue> files;
  for (const auto& [name, e] : experts) {
    const at::Tensor v = value(name).detach();
    for (const auto& slot : expert_slots(name, e)) {
      auto [it, fresh] = files.try_emplace({slot.layer, slot.global_expert}, PyValue());
      if (fresh) it->second = PyValue::ordered_dict();
      // clone: a slice (or a view into a flat buffer) would be saved with its whole storage.
      at::Tensor t = slot.slice < 0 ? v.clone() : v.select(0, slot.slice).clone();
      it->second.set(PyValue(slot.key), PyValue(std::move(t)));
    }
  }
  for (const auto& [at, dict] : files)
    save_torch_file(dict, expert_states_path(dir, tag, at.first, at.second, mp_rank));
}

std::map<std::string, nn::moe::ExpertParam> one_rank_experts(
    const std::map<std::string, nn::moe::ExpertParam>& saved) {
  std::map<std::string, nn::moe::ExpertParam> out;
  for (const auto& [name, e] : saved) {
    nn::moe::ExpertParam one = e;
    one.num_local_experts = e.num_local_experts * e.ep_size;
    one.ep_size = 1;
    one.ep_rank = 0;
    if (e.local_expert < 0) {
      out.emplace(name, one);
      continue;
    }
    for (int64_t r = 0; r < e.ep_size; ++r) {
      nn::moe::ExpertParam at = e;
      at.ep_rank = r;
      for (const auto& slot : expert_slots(name, at)) {
        one.local_expert = static_cast<int>(slot.global_expert);
        out.emplace(slot.key, one);
      }
    }
  }
  return out;
}

PyValue module_with_experts(const PyValue& module,
                            const std::map<std::string, nn::moe::ExpertParam>& experts,
                            ExpertFiles& files) {
  PyValue out = PyValue::ordered_dict();
  for (size_t i = 0; i < module.size(); ++i) out.set(module.keys()[i], module.values()[i]);
  for (const auto& [name, e] : experts) out.set(PyValue(name), PyValue(files.local_value(name, e)));
  return out;
}

PyValue module_at_experts(const PyValue& one_rank_module,
                          const std::map<std::string, nn::moe::ExpertParam>& experts,
                          const std::string& where) {
  const auto one = one_rank_experts(experts);
  PyValue out = PyValue::ordered_dict();
  for (size_t i = 0; i < one_rank_module.size(); ++i) {
    const PyValue& k = one_rank_module.keys()[i];
    if (!k.is_string() || !one.count(k.as_string())) out.set(k, one_rank_module.values()[i]);
  }
  for (const auto& [name, e] : experts) {
    std::vector<at::Tensor> parts;
    for (const auto& slot : expert_slots(name, e)) {
      // A clone's slot key is its one-rank name; a stacked weight keeps its name, [E, ...].
      const std::string& key = slot.slice < 0 ? slot.key : name;
      const PyValue* v = one_rank_module.find(PyValue(key));
      if (!v || !v->is_tensor())
        throw CheckpointError(fmt::format("{} holds no '{}' (expert {} of '{}')", where, key,
                                          slot.global_expert, name));
      parts.push_back(slot.slice < 0 ? v->as_tensor()
                                     : v->as_tensor().select(0, slot.global_expert));
    }
    out.set(PyValue(name), PyValue(e.local_expert >= 0 ? parts.at(0) : at::stack(parts)));
  }
  return out;
}

ExpertFiles::ExpertFiles(std::string dir, std::string tag, std::vector<int64_t> saved_num_experts,
                         std::string model_path, int mp_rank)
    : dir_(std::move(dir)),
      tag_(std::move(tag)),
      model_path_(std::move(model_path)),
      num_experts_(std::move(saved_num_experts)),
      mp_rank_(mp_rank) {}

ExpertFiles ExpertFiles::of_model(const std::string& dir, const std::string& tag,
                                  const PyValue& model, const std::string& model_path,
                                  int mp_rank) {
  const PyValue* n = model.is_dict() ? model.find(PyValue("num_experts")) : nullptr;
  if (!n)
    throw CheckpointError("'" + model_path +
                          "' has no 'num_experts' entry: not a MoE checkpoint, but the model has "
                          "expert parameters");
  if (!n->is_list())
    throw CheckpointError("'" + model_path +
                          "': 'num_experts' is not a list (DeepSpeed's old MoE layout, "
                          "expert_<E>_mp_rank_XX files, which dscpp does not read)");
  return ExpertFiles(dir, tag, n->as_ints(), model_path, mp_rank);
}

void ExpertFiles::check_model(const std::map<std::string, nn::moe::ExpertParam>& experts) const {
  const auto ours = num_experts_per_layer(experts);
  if (ours != num_experts_)
    throw CheckpointError(fmt::format(
        "'{}' is a checkpoint of another MoE model: num_experts per MoE layer [{}], the model "
        "[{}]",
        model_path_, fmt::join(num_experts_, ", "), fmt::join(ours, ", ")));
}

const at::Tensor& ExpertFiles::tensor(const ExpertSlot& slot) {
  auto it = files_.find({slot.layer, slot.global_expert});
  const std::string path = expert_states_path(dir_, tag_, slot.layer, slot.global_expert, mp_rank_);
  if (it == files_.end()) {
    if (static_cast<size_t>(slot.layer) >= num_experts_.size() ||
        slot.global_expert >= num_experts_[slot.layer])
      throw CheckpointError(fmt::format("'{}' has no expert {} in MoE layer {} (num_experts [{}])",
                                        model_path_, slot.global_expert, slot.layer,
                                        fmt::join(num_experts_, ", ")));
    if (!std::filesystem::is_regular_file(path))
      throw CheckpointError(fmt::format(
          "MoE checkpoint '{}' has no file of expert {} of MoE layer {} (expected '{}')",
          tag_dir(dir_, tag_), slot.global_expert, slot.layer, path));
    it =
        files_.emplace(std::make_pair(slot.layer, slot.global_expert), load_torch_file(path)).first;
    if (!it->second.is_dict()) throw CheckpointError("'" + path + "' does not hold a state dict");
  }
  const PyValue* v = it->second.find(PyValue(slot.key));
  if (!v || !v->is_tensor())
    throw CheckpointError(fmt::format("'{}' has no tensor '{}'", path, slot.key));
  return v->as_tensor();
}

at::Tensor ExpertFiles::local_value(const std::string& name, const nn::moe::ExpertParam& e) {
  const auto slots = expert_slots(name, e);
  if (e.local_expert >= 0) return tensor(slots.at(0));
  std::vector<at::Tensor> parts;
  for (const auto& s : slots) parts.push_back(tensor(s));
  return at::stack(parts);
}

}  // namespace dscpp::checkpoint
