// GPT: a decoder-only transformer as GPT-2 and Megatron-LM build it. Learned token and position
// embeddings; pre-LayerNorm blocks of causal self-attention (fused scaled-dot-product
// attention) and a GELU MLP, each added to the residual stream after dropout; a final
// LayerNorm; an output head that multiplies by the token embedding (tied, the default) or has
// its own weight. The current models' blocks, by GPTConfig's Megatron keys: RMSNorm for every
// norm, rotary positions on q and k instead of the position table, a SwiGLU MLP, grouped-query
// attention (k and v heads shared by consecutive groups of query heads), linears without bias.
// forward(input_ids [B,S] int64) gives logits [B,S,V] in the parameters' dtype; loss() is the mean
// token cross entropy, computed in fp32.
//
// Initialisation (GPT-2 / Megatron): every weight matrix and embedding ~ normal(0,
// init_method_std), except the output projection of each residual branch (attention's proj,
// the MLP's proj) ~ normal(0, init_method_std / sqrt(2 * num_layers)); biases zero;
// LayerNorm weights one.
//
// The same model as LayerSpecs (gpt_layer_specs): "embedding", "blocks.0" .. "blocks.<L-1>",
// "final_norm", "head"; these are also GPT's submodule names, so state dict keys match.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "dscpp/config/ds_config.h"
#include "dscpp/model_zoo/gpt_blocks.h"
#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/model_zoo/gpt_moe.h"
#include "dscpp/nn/activation_checkpointing.h"
#include "dscpp/nn/fp8_meta.h"
#include "dscpp/nn/layer_spec.h"
#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::model_zoo {

// y = x W^T + b, with torch::nn::Linear's parameter names ("weight" [out, in], "bias" [out])
// but without its kaiming initialisation: the GPT draws every weight itself, and a second
// serial pass over billions of CPU parameters costs minutes. weight and bias start
// uninitialised; bias is undefined when there is none.
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = true);
  at::Tensor weight, bias;
};
TORCH_MODULE(Linear);

// Token plus position embedding, then dropout: input_ids [B,S] int64 -> [B,S,h]. With a
// sequence-parallel group of p ranks, input_ids is rank r's slice of a sequence p times as
// long, its positions starting at r S.
struct GPTEmbeddingImpl : torch::nn::Module {
  explicit GPTEmbeddingImpl(const GPTConfig& config, nn::GroupPtr sequence_group = nullptr);
  at::Tensor forward(const at::Tensor& input_ids);

  torch::nn::Embedding word{nullptr};      // [vocab_size, h]
  torch::nn::Embedding position{nullptr};  // [max_position_embeddings, h]; none with rope
  double dropout = 0;                      // hidden_dropout
  int64_t max_positions = 0;               // max_position_embeddings: the longest sequence
  nn::GroupPtr sequence_group;             // DeepSpeed-Ulysses' ranks; null: none
};
TORCH_MODULE(GPTEmbedding);

// Causal multi-head self-attention: [B,S,h] -> [B,S,h] (before the residual dropout). With a
// sequence-parallel group (DeepSpeed-Ulysses), x is this rank's slice of the sequence: q, k
// and v go through an all-to-all to all of the sequence for a block of whole key/value groups
// (groups / p, or one more where p does not divide them: nn::all_to_all_sequence_to_heads)
// with their query heads, which rotary embedding and attention see whole; the output comes
// back by the converse all-to-all.
struct GPTAttentionImpl : torch::nn::Module {
  explicit GPTAttentionImpl(const GPTConfig& config, nn::GroupPtr sequence_group = nullptr);
  at::Tensor forward(const at::Tensor& x);

  // [(heads + 2 groups) d, h]: the rows of q (heads x d), then k, then v (groups x d each);
  // head-major in each. Query head i attends with key/value head i / (heads / groups).
  Linear qkv{nullptr};
  Linear proj{nullptr};  // [h, h]: the residual branch's output projection
  int64_t heads = 0;
  int64_t groups = 0;      // num_query_groups
  int64_t rotary_dim = 0;  // 0: no rope
  double rotary_base = 10000;
  double dropout = 0;  // attention_dropout, on the attention probabilities
  nn::GroupPtr sequence_group;
};
TORCH_MODULE(GPTAttention);

// fc, GELU, proj: [B,S,h] -> [B,S,h] (before the residual dropout). swiglu: fc's output is
// [gate, up] (Megatron's linear_fc1 layout) and the activation silu(gate) * up.
// With tiled_mlp_shards > 1, over that many tiles of the sequence (nn::tiled_compute).
struct GPTMLPImpl : torch::nn::Module {
  explicit GPTMLPImpl(const GPTConfig& config);
  at::Tensor forward(const at::Tensor& x);
  // The MLP with the weights given ({fc.weight, fc.bias, proj.weight, proj.bias}, the biases
  // left out without add_bias_linear): forward's own maths, what each tile runs.
  at::Tensor forward_with(const at::Tensor& x, const std::vector<at::Tensor>& weights) const;

  Linear fc{nullptr};  // [ffn, h]; swiglu: [2 ffn, h], the gate's rows first
  bool swiglu = false;
  Linear proj{nullptr};     // [h, ffn]: the residual branch's output projection
  std::string approximate;  // at::gelu's: "tanh" or "none"
  bool fused = true;        // bias add and GELU in one kernel (bias_gelu_fusion)
  int64_t tiles = 1;        // tiled_mlp_shards
};
TORCH_MODULE(GPTMLP);

// x + drop(attn(ln_1(x))), then h + drop(mlp(ln_2(h))). With residual_layernorm_fusion the
// first add and ln_2 are one op (ops::add_layer_norm). Only that add: the block's last add
// feeds the next block's ln_1 across the block boundary, where one tensor passes (the
// pipeline's LayerSpecs, activation checkpointing's unit), so it stays eager.
// Block `layer` of an MoE config whose moe_layer_freq marks it runs the MoE layer
// (gpt_moe.h) as its MLP, registered under the same name "mlp" (Megatron-DeepSpeed's
// mlp.deepspeed_moe.*); `ep_group` is the expert-parallel group (null at degree 1).
struct GPTBlockImpl : torch::nn::Module {
  explicit GPTBlockImpl(const GPTConfig& config, int64_t layer = 0,
                        const std::shared_ptr<comm::ProcessGroup>& ep_group = nullptr,
                        const nn::GroupPtr& sequence_group = nullptr);
  at::Tensor forward(const at::Tensor& x);

  std::shared_ptr<torch::nn::Module> ln_1;  // make_norm's: LayerNorm or RMSNorm
  GPTAttention attn{nullptr};
  std::shared_ptr<torch::nn::Module> ln_2;
  GPTMLP mlp{nullptr};         // a dense block's MLP; null in an MoE block
  nn::moe::MoE moe{nullptr};   // an MoE block's MLP (registered as "mlp"); null when dense
  double moe_l_aux_coeff = 0;  // moe_l_aux_coeff_of(config)
  MoELayerStats moe_stats;     // an MoE block's routing since the last take_moe_stats
  double dropout = 0;          // hidden_dropout
  bool fused_add_norm = true;  // residual_layernorm_fusion
  int64_t layer = 0;           // this block's index in the model
  // Its linear products in fp8 (GPTConfig::fp8_recipe_of); nullopt: bf16. Applied in
  // forward, so that activation checkpointing's recompute multiplies the same way.
  std::optional<nn::Fp8Recipe> fp8;
  nn::Fp8Meta fp8_meta{nullptr};  // a delayed recipe's state (registered as "fp8_meta")

 private:
  at::Tensor run_mlp(const at::Tensor& x);
};
TORCH_MODULE(GPTBlock);

struct GPTImpl : torch::nn::Module {
  // expert_parallel_group: an MoE config's expert-parallel group, of
  // parallelism.expert_model_parallel_size ranks (comm::new_expert_groups); null at 1.
  // sequence_group: DeepSpeed-Ulysses' group, of parallelism.sequence_parallel_size consecutive
  // ranks; null at 1. Each rank's input_ids and targets are then its slice of the sequences
  // (sequence_slice), and the loss its share (sequence_parallel_loss).
  explicit GPTImpl(GPTConfig config,
                   const std::shared_ptr<comm::ProcessGroup>& expert_parallel_group = nullptr,
                   const nn::GroupPtr& sequence_group = nullptr);

  // input_ids [B,S] int64 with S <= max_position_embeddings -> logits [B,S,vocab_size]; with
  // targets [B,S] (as Hugging Face's labels), the loss instead (loss()'s mean), never holding
  // the whole logits when tiled_logits_loss_shards > 1 (ops::tiled_cross_entropy from the
  // final hidden states). One forward with a default argument, not two overloads, so that
  // ModuleHolder's operator() still finds its return type.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& targets = {});
  // Mean cross entropy of logits [B,S,V] against targets [B,S] int64, in fp32; targets of
  // -100 are left out (PyTorch's ignore_index).
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) const;

  // Checkpoints the blocks from now on, as a ds_config "activation_checkpointing" section
  // asks (its options, and number_checkpoints: how many checkpointed segments of consecutive
  // blocks, as even as possible; absent: one per block). Returns, and prints to stderr, a
  // note for each key that has no effect in dscpp. Throws ConfigError when
  // number_checkpoints exceeds num_layers.
  std::vector<std::string> enable_activation_checkpointing(
      const ActivationCheckpointingConfig& section = {});
  void disable_activation_checkpointing() { segments_ = 0; }
  // Checkpointed segments of blocks; 0 when checkpointing is off.
  int64_t activation_checkpointing_segments() const { return segments_; }

  const GPTConfig& config() const { return config_; }

  GPTEmbedding embedding{nullptr};
  torch::nn::ModuleList blocks{nullptr};          // of GPTBlock
  std::shared_ptr<torch::nn::Module> final_norm;  // make_norm's: LayerNorm or RMSNorm
  Linear head{nullptr};  // only when the embeddings are not tied: [V, h], no bias

 private:
  at::Tensor hidden(const at::Tensor& input_ids);  // the final norm's output [B,S,h]

  GPTConfig config_;
  std::vector<GPTBlock> block_list_;  // the blocks' typed holders, in order
  int64_t segments_ = 0;
  activation_checkpointing::Options checkpoint_options_;
};
TORCH_MODULE(GPT);

// GPT's loss: the mean token cross entropy of logits [B,S,V] against targets [B,S] int64, in
// fp32, targets of -100 left out. For the LayerSpec form, whose module has no loss().
// fused: cross_entropy_loss_fusion (ops::cross_entropy), else the eager fp32 upcast.
at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets, bool fused = true);

// DeepSpeed-Ulysses' group checked against the config: of parallelism.sequence_parallel_size
// ranks (null at 1), at least one key/value group a rank (of each tensor rank's, with
// tensor_degree > 1; the groups need not divide by the ranks, as in DeepSpeed's uneven split),
// and equal slices of seq_length; a ConfigError naming the key and the numbers otherwise.
nn::GroupPtr checked_sequence_group(const GPTConfig& config, const nn::GroupPtr& group,
                                    int64_t tensor_degree = 1);

// DeepSpeed-Ulysses: rank r's slice [B, S/p] of tokens [B, S] (input ids or targets: slice the
// targets after the shift, so each slice keeps its last token's target).
at::Tensor sequence_slice(const at::Tensor& tokens, const nn::GroupPtr& sequence_group);
// This rank's share of the sequences' mean loss, from the mean over its slice's counted targets
// (not -100): mean · counted / (the group's counted). The shares sum to the whole sequences'
// mean; the engine sums the sequence ranks' gradients (their average over the data ranks
// only), so the gradient is the one-rank run's. `mean_loss` returned as it is without a group.
at::Tensor sequence_parallel_loss(const at::Tensor& mean_loss, const at::Tensor& targets,
                                  const nn::GroupPtr& sequence_group);

// The GPT of `config` as a list of layers (each block checkpointed when
// config.checkpoint_activations, with `checkpoint_options`: the ds_config's); the head is tied to
// the embedding (tied_key "embedding", weight "word.weight") when tie_word_embeddings is on. An MoE
// config's blocks are MoE where moe_layer_freq says, on `expert_parallel_group` at expert degree >
// 1 (as GPT's; a ConfigError naming parallelism.expert_model_parallel_size without a group of that
// size). A pipeline's ranks make it on the pipe x data topology, so that it lies inside their
// stage's data group.
std::vector<nn::LayerSpec> gpt_layer_specs(
    const GPTConfig& config,
    const std::shared_ptr<comm::ProcessGroup>& expert_parallel_group = nullptr,
    const nn::GroupPtr& sequence_group = nullptr,
    const activation_checkpointing::Options& checkpoint_options = {});

// The routing statistics of every MoE block under `root` (GPT, its LayerSpec form, a pipeline
// stage's module, ...), in module order, each with its block's index (MoELayerStats::layer),
// each reset to empty after the take: the training log's.
std::vector<MoELayerStats> take_moe_stats(torch::nn::Module& root);

}  // namespace dscpp::model_zoo
