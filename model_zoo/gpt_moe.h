// The MoE GPT's MLP: a block that GPTConfig::moe marks (moe_layer_freq) runs nn/moe's MoE layer
// in its MLP's place, built from the model config's Megatron keys:
// - router: TopKGate over num_experts with moe_router_topk, the score function, the expert
//   bias, group-limited routing and the top-k scaling factor; use_rts, second-expert sampling
//   and noisy gating off (Megatron has none of them); dropless unless
//   moe_expert_capacity_factor is given (then eval uses the same factor; no minimum capacity,
//   as Megatron's ceil(tokens * topk / experts * factor)).
// - routed experts: a GroupedMLP of moe_ffn_size(), SwiGLU when the model's MLP is, else the
//   dense blocks' GELU (gelu_approximation: the tanh approximation or the exact one).
// - shared expert: a GPTMLP of moe_shared_expert_intermediate_size (the model's own MLP kind);
//   in the tensor-parallel GPT a TensorParallelGPTMLP of that width, cut over the model group
//   as the dense MLP is (Megatron's shared experts are tensor-parallel too).
// - tensor parallelism (tensor_group of t > 1 ranks): the routed experts are replicas over the
//   tensor group (DeepSpeed's default; its enable_expert_tensor_parallelism off) and each
//   tensor rank dispatches 1/t of the tokens (nn/moe/moe.h's token split); with
//   parallelism.sequence_parallel each tensor rank routes and dispatches its own sequence shard
//   instead (nn/moe/moe.h; the router's counts summed over the tensor group, its aux losses
//   Megatron's parts, the capacity per shard).
// - LatentMoE: moe_latent_size.
// Initialisation is the GPT's (Megatron's): the router, the experts' first products and the
// latent down-projection ~ normal(0, init_method_std); the experts' second products and the
// latent up-projection ~ normal(0, init_method_std / sqrt(2 L)), as residual-branch outputs;
// each routed expert drawn by its global id (nn::normal_init_experts), so that the model at
// expert degree E holds exactly the experts of the model at degree 1 built after the same seed,
// and the layers built after it draw the same values too.
//
// Losses: in training, moe_aux_loss_coeff x the router's l_aux (load-balancing type
// "aux_loss"; Megatron's switch loss E * sum_e f_e P_e equals DeepSpeed's top-k l_aux) goes to
// nn::add_aux_loss, beside the router's own z-loss and sequence-wise loss ("seq_aux_loss",
// moe_aux_loss_coeff its coefficient): a training forward runs under an nn::AuxLossScope and
// adds its sum to the loss (train_gpt does). With checkpoint_activations a block's losses reach
// that scope through the checkpoint (nn/activation_checkpointing.h), and its routing is counted
// once, in forward, not again when backward recomputes the block.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/nn/moe/moe.h"

namespace dscpp::comm {
class ProcessGroup;
}

namespace dscpp::model_zoo {

// What one MoE layer routed since the last take_moe_stats(): for the training log.
struct MoELayerStats {
  at::Tensor tokens_per_expert;  // int64 [num_experts]: routes chosen (before any drop), summed
  at::Tensor l_aux;              // fp32 0-dim: the router's l_aux (unscaled), summed
  int64_t forwards = 0;          // forwards counted
  int64_t layer = -1;            // the block's index in the model (set by take_moe_stats)
};

// The MoE layer of `config` (config.moe.enabled()); `ep_group` is the expert-parallel group
// of parallelism.expert_model_parallel_size ranks (null at 1); tensor_group the
// tensor-parallel GPT's model group (null, or one rank: the GPT's layer); sequence_group
// DeepSpeed-Ulysses' (the router counts over it: nn::moe::MoEOptions::sequence_group).
nn::moe::MoE make_moe_mlp(const GPTConfig& config,
                          const std::shared_ptr<comm::ProcessGroup>& ep_group,
                          const std::shared_ptr<comm::ProcessGroup>& tensor_group = nullptr,
                          const std::shared_ptr<comm::ProcessGroup>& sequence_group = nullptr);

// The MoE blocks' expert-parallel group: null at expert degree 1, else `ep_group`, which must
// have that many ranks (a ConfigError naming parallelism.expert_model_parallel_size).
std::shared_ptr<comm::ProcessGroup> checked_expert_parallel_group(
    const GPTConfig& config, const std::shared_ptr<comm::ProcessGroup>& ep_group);

// The coefficient run_moe_mlp gives l_aux: moe_aux_loss_coeff with load-balancing type
// "aux_loss", else 0 (seq_aux_loss's goes to the router itself).
double moe_l_aux_coeff_of(const GPTConfig& config);

// Runs the layer on x [B, S, h]; in training adds l_aux_coeff x l_aux to the aux-loss channel
// (when not 0) and counts the routing into `stats` (not when recomputing). Returns [B, S, h].
at::Tensor run_moe_mlp(nn::moe::MoEImpl& moe, const at::Tensor& x, double l_aux_coeff,
                       bool training, MoELayerStats& stats);

}  // namespace dscpp::model_zoo
