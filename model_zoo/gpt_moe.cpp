// The MoE GPT's MLP: see gpt_moe.h.
#include "dscpp/model_zoo/gpt_moe.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>

#include <fmt/format.h>

#include <string>

#include "dscpp/config/config_error.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/activation_checkpointing.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/normal_init.h"

namespace dscpp::model_zoo {

namespace moe = nn::moe;

std::shared_ptr<comm::ProcessGroup> checked_expert_parallel_group(
    const GPTConfig& c, const std::shared_ptr<comm::ProcessGroup>& ep_group) {
  const int64_t ep = c.parallelism.expert_model_parallel_size;
  if (ep > 1 && (!ep_group || ep_group->size() != ep))
    throw ConfigError("parallelism.expert_model_parallel_size",
                      fmt::format("{}: the GPT needs the expert-parallel group of {} ranks "
                                  "(comm::new_expert_groups), got {}",
                                  ep, ep,
                                  ep_group ? fmt::format("a group of {}", ep_group->size())
                                           : std::string("none")));
  return ep > 1 ? ep_group : nullptr;
}

nn::moe::MoE make_moe_mlp(const GPTConfig& c, const std::shared_ptr<comm::ProcessGroup>& ep_group,
                          const std::shared_ptr<comm::ProcessGroup>& tensor_group,
                          const std::shared_ptr<comm::ProcessGroup>& sequence_group) {
  const bool tensor_parallel = nn::tensor_model_parallel_size(tensor_group) > 1;
  const MoEConfig& m = c.moe;
  const int64_t ep = c.parallelism.expert_model_parallel_size;
  const bool dropless = !(m.moe_expert_capacity_factor > 0.0);
  moe::MoEOptions o(c.hidden_size);
  o.num_experts(m.num_experts)
      .ep_size(ep)
      .ep_group(ep > 1 ? ep_group : nullptr)
      .k(m.moe_router_topk)
      .capacity_factor(dropless ? 0.0 : m.moe_expert_capacity_factor)
      .eval_capacity_factor(dropless ? 0.0 : m.moe_expert_capacity_factor)
      .min_capacity(0)
      .drop_tokens(!dropless)
      .use_rts(false)
      .top2_2nd_expert_sampling(false)
      .score_function(m.moe_router_score_function == "sigmoid" ? moe::ScoreFunction::kSigmoid
                                                               : moe::ScoreFunction::kSoftmax)
      .topk_scaling_factor(m.moe_router_topk_scaling_factor)
      .z_loss_coeff(m.moe_z_loss_coeff)
      .seq_aux_loss_coeff(m.moe_router_load_balancing_type == "seq_aux_loss" ? m.moe_aux_loss_coeff
                                                                             : 0.0)
      .num_groups(m.moe_router_num_groups)
      .group_topk(m.moe_router_group_topk)
      .enable_expert_bias(m.moe_router_enable_expert_bias)
      .bias_update_rate(m.moe_router_bias_update_rate)
      .ffn_hidden_size(c.moe_ffn_size())
      .activation(c.swiglu                         ? moe::Activation::kSwiglu
                  : c.gelu_approximation == "tanh" ? moe::Activation::kGeluTanh
                                                   : moe::Activation::kGelu)
      .latent_size(m.moe_latent_size)
      .tensor_group(tensor_parallel ? tensor_group : nullptr)
      .sequence_parallel(tensor_parallel && c.parallelism.sequence_parallel)
      .sequence_group(sequence_group);
  if (m.moe_shared_expert_intermediate_size > 0) {
    GPTConfig shared = c;
    shared.ffn_hidden_size = m.moe_shared_expert_intermediate_size;
    // Drawn whole in GPTMLP's order either way: the cut one holds the slices of GPTMLP's.
    if (tensor_parallel)
      o.shared_expert(torch::nn::AnyModule(TensorParallelGPTMLP(shared, tensor_group)));
    else
      o.shared_expert(torch::nn::AnyModule(GPTMLP(shared)));
  }
  moe::MoE layer(o);
  // Megatron's initialisation in place of nn.Linear's (gpt_moe.h).
  auto& inner = *layer->deepspeed_moe;
  nn::normal_init(inner.gate->wg->weight, c.init_method_std);
  auto* grouped = dynamic_cast<moe::GroupedMLPImpl*>(inner.experts.get());
  // Each expert by its global id (nn::normal_init_experts): the same values at every expert
  // degree, so the GPT at ep E starts from ep 1's weights.
  const int64_t first = grouped->options.first_expert();
  nn::normal_init_experts(grouped->weight1, c.init_method_std, first);
  nn::normal_init_experts(grouped->weight2, c.residual_init_std(), first);
  if (layer->latent_down) {
    nn::normal_init(layer->latent_down->weight, c.init_method_std);
    nn::normal_init(layer->latent_up->weight, c.residual_init_std());
  }
  return layer;
}

double moe_l_aux_coeff_of(const GPTConfig& c) {
  return c.moe.moe_router_load_balancing_type == "aux_loss" ? c.moe.moe_aux_loss_coeff : 0.0;
}

at::Tensor run_moe_mlp(nn::moe::MoEImpl& layer, const at::Tensor& x, double l_aux_coeff,
                       bool training, MoELayerStats& stats) {
  moe::MoEOutput out = layer.forward(x);
  if (training && l_aux_coeff > 0.0) nn::add_aux_loss(out.l_aux * l_aux_coeff);
  // (A checkpointed block's recompute adds its loss again, to the recompute's own scope, but
  // its routing was counted in forward.)
  if (training && !activation_checkpointing::recomputing()) {
    at::NoGradGuard no_grad;
    const at::Tensor counts = out.exp_counts.detach().to(at::kLong);
    const at::Tensor l_aux = out.l_aux.detach().to(at::kFloat);
    if (!stats.tokens_per_expert.defined()) {
      stats.tokens_per_expert = counts.clone();
      stats.l_aux = l_aux.clone();
    } else {
      stats.tokens_per_expert.add_(counts);
      stats.l_aux.add_(l_aux);
    }
    ++stats.forwards;
  }
  return out.output;
}

}  // namespace dscpp::model_zoo
