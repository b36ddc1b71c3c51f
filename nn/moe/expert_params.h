// Which of a module's parameters belong to experts, found by walking its module tree (LibTorch
// parameters carry no attributes; DeepSpeed marks its expert parameters allreduce=False with a
// group_name). Every parameter under an MoE layer's experts is one: an Experts' clones
// (deepspeed_experts.<i>.*, one expert each) or a GroupedMLP's stacked weight1 / weight2 (dim 0
// runs over its local experts). The gate, shared experts, residual MLP and latent projections
// are dense: reduced over the data group like the rest of the model.
//
// moe_layer counts the MoE layers in the order the module tree lists them (DeepSpeed's
// moe_layer_id, the L of layer_L_expert_E_mp_rank_XX_model_states.pt); a global expert id is
// ep_rank * num_local_experts + local expert.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dscpp/comm/process_group.h"

namespace dscpp::nn::moe {

struct ExpertParam {
  int moe_layer = 0;
  int local_expert = -1;  // the clone's index; -1: stacked over the local experts on dim 0
  int64_t num_local_experts = 1;
  int64_t ep_size = 1;
  int64_t ep_rank = 0;                           // this rank's place in its expert-parallel group
  std::shared_ptr<comm::ProcessGroup> ep_group;  // the layer's expert-parallel group (ep_size > 1)
};

// Expert parameters by their state_dict names under `root` (with `prefix`: "prefix.name").
std::map<std::string, ExpertParam> expert_parameters(const torch::nn::Module& root,
                                                     const std::string& prefix = "");

}  // namespace dscpp::nn::moe
