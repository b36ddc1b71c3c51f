// The MoE router: DeepSpeed's TopKGate (deepspeed/moe/sharded_moe.py) and what current models
// add to it. Logits are x·wgᵀ in fp32 whatever x's dtype; scores are their softmax (DeepSpeed)
// or sigmoid (DeepSeek-V3). Each token picks k experts by score (plus the balancing bias, plus
// noise where asked), restricted with device-limited routing to the experts of its best
// `group_topk` of `num_groups` contiguous expert groups (Megatron's group_limited_topk: a
// group scores the sum of its best k/group_topk selection scores).
//
// Capacity, as DeepSpeed: C = max(ceil(tokens/experts · factor · k), min_capacity) with the
// training or the eval factor; drop_tokens false or a factor of 0 is dropless. What is dropped
// is DeepSpeed's per-k rule: k = 1 keeps C tokens per expert chosen by torch.topk over the
// selection mask (random ones with use_rts); k = 2 keeps first choices (token order) before
// second choices; k > 2 keeps the C with the largest score ("probs"). Combine weights come from
// the unbiased scores: the raw score for k = 1, for k > 1 normalised over the kept routes
// (DeepSpeed; with sigmoid, DeepSeek-V3's normalisation over the chosen), times
// topk_scaling_factor. Dropped routes weigh 0.
//
// Losses: l_aux is DeepSpeed's (unscaled; top-1: E·Σ me·ce, top-2: E²·mean(me·ce) on first
// choices, top-k: E²/k·mean(me·ce); with sigmoid, me is over the sum-normalised scores).
// z_loss = coeff · mean(logsumexp(logits)²); seq_aux_loss = coeff · mean over sequences of
// Σ_e (count_e·E/(k·T)) · mean_t p_e (DeepSeek-V3, Megatron's seq_aux_loss): both only when
// their coefficient is non-zero. exp_counts are the chosen routes per expert before dropping.
//
// Bias-based balancing (enable_expert_bias): a per-expert fp32 buffer `expert_bias` (in the
// state dict, never a parameter) added to the scores for selection only; training forwards
// count the tokens per expert (not again when an activation checkpoint recomputes them), and
// update_expert_bias() adds rate · sign(mean - count) from
// those counts (summed over the given group first) and restarts the count. The buffer stays
// fp32 when the module is cast to fp16/bf16 (as Megatron's router keeps it,
// _maintain_float32_expert_bias): the update rate, 1e-3 by default, is below bf16's
// resolution near 1 (2^-7), so a 16-bit bias would stop moving once it reached that size.
//
// Sequence parallelism (sequence_partition_group of t > 1 ranks, Megatron's tp_cp_group): x is
// this rank's shard of the tokens, [T/t, B] flattened sequence-major (Megatron's layout), and
// seq_length is T/t. Selection and the capacity are this shard's own (Megatron's: capacity from
// the shard's tokens, drops among them); the counts are summed over the group (one all-reduce
// per forward) so that exp_counts, the expert-bias counts and the aux losses' fractions are
// those of all t·S tokens, and each loss is this rank's part of the whole batch's: l_aux and
// seq_aux_loss with the scores summed over this shard and divided by the whole token count
// (DeepSpeed-Ulysses' shards are batch-major slices [B, T/t] instead: sequence_major_shards)
// (Megatron's switch_load_balancing_loss_func with tokens_per_expert reduced over the group and
// total_num_tokens = S·t), z_loss with its coefficient divided by t. Their sum over the group,
// which the gradients' sum over it (the router weight is marked sequence_parallel) turns into,
// is the loss of t = 1 on the same tokens.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>

namespace dscpp::comm {
class ProcessGroup;
}

namespace dscpp::nn::moe {

enum class ScoreFunction { kSoftmax, kSigmoid };

struct TopKGateOptions {
  TopKGateOptions(int64_t model_dim, int64_t num_experts)
      : model_dim_(model_dim), num_experts_(num_experts) {}
  TORCH_ARG(int64_t, model_dim);
  TORCH_ARG(int64_t, num_experts);
  TORCH_ARG(int64_t, k) = 1;                         // experts per token, 1..min(8, E)
  TORCH_ARG(double, capacity_factor) = 1.0;          // training; 0: dropless
  TORCH_ARG(double, eval_capacity_factor) = 1.0;     // eval mode; 0: dropless
  TORCH_ARG(int64_t, min_capacity) = 8;              // DeepSpeed's TopKGate default
  TORCH_ARG(std::string, noisy_gate_policy) = "";    // "", "None", "Jitter", "RSample" (k = 1)
  TORCH_ARG(bool, drop_tokens) = true;               // false: capacity = the largest count
  TORCH_ARG(bool, use_rts) = true;                   // k = 1: random token selection
  TORCH_ARG(bool, top2_2nd_expert_sampling) = true;  // k = 2: Gumbel noise on the 2nd choice
  TORCH_ARG(ScoreFunction, score_function) = ScoreFunction::kSoftmax;
  TORCH_ARG(double, topk_scaling_factor) = 1.0;  // Megatron's moe_router_topk_scaling_factor
  TORCH_ARG(double, z_loss_coeff) = 0.0;         // moe_z_loss_coeff
  TORCH_ARG(double, seq_aux_loss_coeff) = 0.0;   // sequence-wise aux loss (needs seq_length)
  TORCH_ARG(int64_t, num_groups) = 1;            // device-limited routing: expert groups
  TORCH_ARG(int64_t, group_topk) = 0;            // groups a token may use; 0: unlimited
  TORCH_ARG(bool, enable_expert_bias) = false;   // moe_router_enable_expert_bias
  TORCH_ARG(double, bias_update_rate) = 1e-3;    // moe_router_bias_update_rate
  // Sequence parallelism's group (see above); null or one rank: x holds every token.
  TORCH_ARG(std::shared_ptr<comm::ProcessGroup>, sequence_partition_group);
  // How a shard's tokens are flattened: Megatron's sequence parallelism [T/t, B] (true), or
  // DeepSpeed-Ulysses' slices [B, T/t] (false); what seq_aux_loss's per-sequence sums read.
  TORCH_ARG(bool, sequence_major_shards) = true;
};

// One forward's routing of S tokens; indices, weights and kept are [S, k], route j of token s
// being its j-th choice.
struct Routing {
  at::Tensor indices;       // int64 experts chosen
  at::Tensor weights;       // fp32 combine weights (0 where dropped), differentiable
  at::Tensor kept;          // bool: the route survived the capacity
  at::Tensor logits;        // fp32 [S, E]
  at::Tensor l_aux;         // DeepSpeed's aux loss, 0-dim fp32
  at::Tensor z_loss;        // coefficient applied; undefined when the coefficient is 0
  at::Tensor seq_aux_loss;  // coefficient applied; undefined when the coefficient is 0
  at::Tensor exp_counts;    // int64 [E], before dropping (sequence parallelism: the group's)
  int64_t capacity = -1;    // -1: dropless
  int64_t num_experts = 0;
};

class TopKGateImpl : public torch::nn::Module {
 public:
  explicit TopKGateImpl(const TopKGateOptions& options);
  // x [S, model_dim] in any floating dtype. seq_length: tokens per sequence when x holds
  // [B, T] flattened batch-major, or with sequence parallelism [T, B] sequence-major (needed by
  // the sequence-wise aux loss; 0: unknown).
  // used_token [S] (k = 1 only, DeepSpeed's): tokens with 0 are neither counted nor routed.
  Routing forward(const at::Tensor& x, int64_t seq_length = 0, const at::Tensor& used_token = {});
  // The bias step from the tokens counted since the last call (summed over `group` when it
  // is given and larger than one rank). No-op without enable_expert_bias.
  void update_expert_bias(const std::shared_ptr<comm::ProcessGroup>& group = nullptr);
  // Tokens counted per expert since the last update (fp32 [E]).
  const at::Tensor& tokens_per_expert() const { return tokens_per_expert_; }
  // Module::to, then expert_bias back to fp32 (a device move keeps it there).
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;

  TopKGateOptions options;
  torch::nn::Linear wg{nullptr};  // [E, model_dim], no bias
  at::Tensor expert_bias;         // fp32 [E] buffer, or undefined

 private:
  // DeepSpeed's selection, capacity and drops through one-hot masks (every case the top-k
  // kernel path does not take): r's indices, kept, weights, exp_counts and capacity; ce, the
  // aux loss's fraction per expert; mask, the chosen routes [S, E].
  void route_with_masks(Routing& r, const at::Tensor& scores, const at::Tensor& used_token,
                        bool dropless, double factor, at::Tensor& ce, at::Tensor& mask);
  at::Tensor tokens_per_expert_;
};
TORCH_MODULE(TopKGate);

// update_expert_bias on every TopKGate inside `module` (a model's training loop calls it after
// each optimizer step, as Megatron does).
void update_expert_biases(torch::nn::Module& module,
                          const std::shared_ptr<comm::ProcessGroup>& group = nullptr);

}  // namespace dscpp::nn::moe
