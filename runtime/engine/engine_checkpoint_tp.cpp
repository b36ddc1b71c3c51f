// Tensor-parallel checkpoints, Megatron-DeepSpeed's layout (docs/checkpoints.md):
//   <tag>/mp_rank_XX_model_states.pt                       tensor rank XX's module shards,
//                                                          written by its data rank 0
//   <tag>/[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt  its data rank D's ZeRO partition
// mp_rank_00's model states carry `dscpp_tensor_parallel`: {tp_degree, data_parallel_size,
// partitions: {name: dscpp_partition}} (universal.h's ParamPartition, the metadata universal
// checkpoints write). With experts, DeepSpeed's MoE layout per tensor rank XX (its
// _get_expert_ckpt_name takes the model-parallel rank). Here: the layout and the metadata.
// Loading reads every tensor rank's files into the checkpoint's normal form
// (universal_from_zero.h) and cuts this engine's shards from it (engine_checkpoint_load.cpp).
#include <map>
#include <optional>
#include <vector>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;

PyValue EngineCore::tensor_parallel_info() {
  const int t = tensor_parallel_size();
  // ZeRO's shapes: at stage 3 the parameters are empty at rest.
  std::map<std::string, std::vector<int64_t>> shape_of;
  for (size_t i = 0; i < param_names_.size(); ++i)
    shape_of[param_names_[i]] = zero_->param_shape(i);
  for (size_t i = 0; i < muon_names_.size(); ++i)
    shape_of[muon_names_[i]] = muon_zero_->param_shape(i);
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

}  // namespace dscpp
