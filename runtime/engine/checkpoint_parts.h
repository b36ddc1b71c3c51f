// Pieces shared by the engine's checkpoint save (engine_checkpoint_save.cpp) and load
// (engine_checkpoint_load.cpp): reading a PyValue dict with errors that name the file
// (runtime/checkpoint/py_dict.h's need), and DeepSpeed's partition layout of the engine's ZeRO
// buffer. Internal to runtime/engine.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/ds_partition.h"
#include "dscpp/runtime/checkpoint/py_dict.h"
#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::engine_checkpoint {

using checkpoint::CheckpointError;
using checkpoint::PyValue;
using checkpoint::detail::need;

inline constexpr size_t kListed = 8;  // names listed in an error before "and N more"

inline std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kListed; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kListed) out += fmt::format(" and {} more", names.size() - kListed);
  return out;
}

inline int64_t step_of(const PyValue& v) {
  return v.is_tensor() ? static_cast<int64_t>(v.as_tensor().item<double>()) : v.as_int();
}

// torch.optim's param_groups: each group's settings and the indices of its parameters
// (ids[g]).
inline PyValue param_groups(const optim::Optimizer& opt,
                            const std::vector<std::vector<int64_t>>& ids) {
  PyValue groups = PyValue::list();
  for (int g = 0; g < opt.num_shards(); ++g) {
    PyValue group = PyValue::from_json(opt.hyper(g));
    PyValue list = PyValue::list();
    for (int64_t i : ids.at(g)) list.append(PyValue(i));
    group.set(PyValue("params"), list);
    groups.append(std::move(group));
  }
  return groups;
}

inline std::vector<int64_t> numels_of(const zero::ZeroOptimizer& zero) {
  std::vector<int64_t> n;
  for (const auto& p : zero.layout().params) n.push_back(p.numel);
  return n;
}

// DeepSpeed's layout of the saved partitions: stage 3 partitions each parameter on its own.
inline checkpoint::DsLayout ds_layout(int stage, const std::vector<int64_t>& numels, int world,
                                      const std::vector<int64_t>& paddings = {}) {
  return stage >= 3 ? checkpoint::DsLayout::build_stage3(numels, world)
                    : checkpoint::DsLayout::build(numels, world, paddings);
}

}  // namespace dscpp::engine_checkpoint
