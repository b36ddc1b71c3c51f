// TensorParallelGPT: model_zoo's GPT (gpt.h) with its layers cut over a model-parallel group
// of t ranks, as Megatron-LM cuts them: the heads split across ranks (QKV column-parallel
// with stride 3, so each rank holds the q, k and v rows of its heads; the attention projection
// row-parallel), the MLP's first linear column-parallel and its second row-parallel, the token
// embedding vocabulary-parallel and the tied head multiplying by this rank's vocabulary rows;
// LayerNorms, the position embedding and the row-parallel biases replicated.
//
// The same parameter names as GPT ("embedding.word.weight", "blocks.0.attn.qkv.weight", ...),
// each described by nn::tensor_parallel_attributes. The master weights are drawn whole in
// GPT's order with GPT's initialisation, and each rank keeps its partition: seeded alike, t
// ranks hold exactly the slices of GPT(config)'s weights.
//
// forward(input_ids [B,S]) gives this rank's logits [B,S,V/t]; loss() is the mean token cross
// entropy through nn::vocab_parallel_cross_entropy (targets of -100 left out), the logits
// never gathered. Attention dropout (split heads) draws under the model-parallel RNG tracker's
// fork (nn::model_parallel_cuda_manual_seed must have been called when it is on), hidden
// dropout (replicated) from the default generator.
//
// Sequence parallelism (config.parallelism.sequence_parallel, Korthikanti et al.): between the
// embedding and the head the activations are Megatron's [S/t, B, h], this rank's 1/t of the
// sequence: the LayerNorms, residual adds and hidden dropouts (then drawn under the tracker's
// fork) see only it; the column-parallel linears all-gather it, the row-parallel ones
// reduce-scatter into it. The LayerNorm parameters are marked sequence_parallel (their
// gradients are partial per rank: the engine sums them over the model group). Same numbers as
// without it. Not here: activation checkpointing in the module form (a ConfigError when asked
// for; the LayerSpec form, gpt_tensor_parallel_specs.h, checkpoints each block).
//
// An MoE config (num_experts): the blocks moe_layer_freq marks run gpt_moe.h's MoE layer in
// the MLP's place, under the same name "mlp", drawn in GPT's order as GPT's MoE blocks draw:
// the router and the routed experts replicated over the model group (each rank routes every
// token alike and dispatches 1/t of them over its expert-parallel group: nn/moe/moe.h), the
// shared expert cut as the dense MLP is. The expert-parallel group is formed among the
// data-parallel ranks of one tensor rank (comm::new_expert_groups on the pipe x data x model
// topology); null at expert degree 1. With sequence parallelism each tensor rank's MoE layer
// routes and dispatches the tokens of its own sequence shard [S/t, B, h] (Megatron's MoE with
// sequence parallelism; nn/moe/moe.h): the router's weight is then sequence_parallel too.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>
#include <vector>

#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/model_zoo/gpt_moe.h"
#include "dscpp/nn/fp8_meta.h"
#include "dscpp/nn/parallel_linear.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/nn/vocab_parallel_embedding.h"

namespace dscpp::model_zoo {

struct TensorParallelGPTEmbeddingImpl : torch::nn::Module {
  TensorParallelGPTEmbeddingImpl(const GPTConfig& config, nn::GroupPtr group,
                                 nn::GroupPtr sequence_group = nullptr);
  // [B,S] -> [B,S,h], whole on every rank; with a sequence group (DeepSpeed-Ulysses) the slice
  // of rank r of it, its positions from r S.
  at::Tensor forward(const at::Tensor& input_ids);

  nn::VocabParallelEmbedding word{nullptr};  // [V/t, h]
  torch::nn::Embedding position{nullptr};    // [positions, h], replicated
  double dropout = 0;
  nn::GroupPtr sequence_group;
};
TORCH_MODULE(TensorParallelGPTEmbedding);

struct TensorParallelGPTAttentionImpl : torch::nn::Module {
  // sequence_group: DeepSpeed-Ulysses' (GPTAttention's all-to-alls on this rank's heads).
  TensorParallelGPTAttentionImpl(const GPTConfig& config, nn::GroupPtr group,
                                 nn::GroupPtr sequence_group = nullptr);
  at::Tensor forward(const at::Tensor& x);

  nn::ColumnParallelLinear qkv{nullptr};  // [3h/t, h]: q, k, v rows of this rank's heads
  nn::RowParallelLinear proj{nullptr};    // [h, h/t]
  int64_t local_heads = 0;                // num_attention_heads / t
  double dropout = 0;
  bool sequence_parallel = false;
  nn::GroupPtr sequence_group;
};
TORCH_MODULE(TensorParallelGPTAttention);

struct TensorParallelGPTMLPImpl : torch::nn::Module {
  TensorParallelGPTMLPImpl(const GPTConfig& config, nn::GroupPtr group);
  at::Tensor forward(const at::Tensor& x);

  nn::ColumnParallelLinear fc{nullptr};  // [ffn/t, h]
  nn::RowParallelLinear proj{nullptr};   // [h, ffn/t]
  std::string approximate;
  bool fused = true;
};
TORCH_MODULE(TensorParallelGPTMLP);

struct TensorParallelGPTBlockImpl : torch::nn::Module, nn::TensorParallelModule {
  // layer: the block's index (an MoE config's moe_layer_freq); ep_group: the expert-parallel
  // group of an MoE block at expert degree > 1.
  TensorParallelGPTBlockImpl(const GPTConfig& config, nn::GroupPtr group, int64_t layer = 0,
                             const nn::GroupPtr& ep_group = nullptr,
                             const nn::GroupPtr& sequence_group = nullptr);
  at::Tensor forward(const at::Tensor& x);
  // With sequence parallelism: the LayerNorms' parameters are sequence_parallel.
  std::map<std::string, nn::TensorParallelAttr> tensor_parallel_attributes() const override;

  torch::nn::LayerNorm ln_1{nullptr};
  TensorParallelGPTAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  TensorParallelGPTMLP mlp{nullptr};  // a dense block's MLP; null in an MoE block
  nn::moe::MoE moe{nullptr};          // an MoE block's MLP (registered as "mlp"); null when dense
  double moe_l_aux_coeff = 0;         // moe_l_aux_coeff_of(config)
  MoELayerStats moe_stats;            // an MoE block's routing since the last take_moe_stats
  int64_t layer = 0;                  // this block's index in the model
  std::optional<nn::Fp8Recipe> fp8;   // GPTConfig::fp8_recipe_of(layer); nullopt: bf16
  nn::Fp8Meta fp8_meta{nullptr};      // a delayed recipe's state (registered as "fp8_meta")
  double dropout = 0;
  bool sequence_parallel = false;
  bool fused_add_norm = true;  // residual_layernorm_fusion: the first add and ln_2 in one op

 private:
  at::Tensor run_mlp(const at::Tensor& x);
};
TORCH_MODULE(TensorParallelGPTBlock);

struct TensorParallelGPTImpl : torch::nn::Module, nn::TensorParallelModule {
  // group: the model-parallel group, of config.parallelism.tensor_model_parallel_size ranks
  // (null for 1); num_attention_heads, the FFN width and vocab_size must divide by it.
  // expert_parallel_group: an MoE config's, of parallelism.expert_model_parallel_size ranks
  // inside this tensor rank's data group; null at 1.
  // sequence_group: DeepSpeed-Ulysses' (GPTImpl's), over ranks of this tensor rank; each
  // tensor rank's heads must then divide by its size.
  TensorParallelGPTImpl(GPTConfig config, nn::GroupPtr group,
                        const nn::GroupPtr& expert_parallel_group = nullptr,
                        const nn::GroupPtr& sequence_group = nullptr);

  at::Tensor forward(const at::Tensor& input_ids);  // -> this rank's logits [B,S,V/t]
  at::Tensor loss(const at::Tensor& logits_parallel, const at::Tensor& targets) const;
  const GPTConfig& config() const { return config_; }
  // With sequence parallelism: final_norm's parameters are sequence_parallel.
  std::map<std::string, nn::TensorParallelAttr> tensor_parallel_attributes() const override;

  TensorParallelGPTEmbedding embedding{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm final_norm{nullptr};
  nn::ColumnParallelLinear head{nullptr};  // only when the embeddings are not tied: [V/t, h]

 private:
  GPTConfig config_;
  nn::GroupPtr group_;
  std::vector<TensorParallelGPTBlock> block_list_;
};
TORCH_MODULE(TensorParallelGPT);

// The pieces TensorParallelGPT and its LayerSpec form (gpt_tensor_parallel_specs.h) share.

// ConfigError unless `config` can be cut over t ranks: its tensor_model_parallel_size is t,
// the heads, FFN width (and an MoE config's shared-expert width) and vocabulary divide by t,
// and with sequence parallelism t > 1 and the sequence divides by t.
void validate_tensor_parallel(const GPTConfig& config, int t);

// The embedding's output [B,S,h] in the blocks' layout: with sequence parallelism this rank's
// [S/t,B,h] (the gradient all-gathered back, so the embeddings' gradients are whole on every
// rank); without, x itself.
at::Tensor to_block_layout(const at::Tensor& embedded, const GPTConfig& config,
                           const nn::GroupPtr& group);

// The untied head: a ColumnParallelLinear [V/t, h] without bias, GPT's initialisation.
nn::ColumnParallelLinear untied_parallel_head(const GPTConfig& config, nn::GroupPtr group);

// The head on the final LayerNorm's output x (the blocks' layout): this rank's logits
// [B,S,V/t]. head: the untied ColumnParallelLinear [V/t, h], or null for the tied head, the
// product with this rank's vocabulary rows `word_weight`.
at::Tensor tensor_parallel_gpt_logits(const at::Tensor& x, const at::Tensor& word_weight,
                                      nn::ColumnParallelLinearImpl* head, const GPTConfig& config,
                                      const nn::GroupPtr& group);

// A LayerNorm whose parameters are sequence_parallel when `sequence_parallel` (it then sees a
// sequence shard: the LayerSpec form's final_norm; parameters "weight" and "bias").
struct SequenceParallelLayerNormImpl : torch::nn::LayerNormImpl, nn::TensorParallelModule {
  SequenceParallelLayerNormImpl(const GPTConfig& config, bool sequence_parallel);
  std::map<std::string, nn::TensorParallelAttr> tensor_parallel_attributes() const override;
  bool sequence_parallel = false;
};

}  // namespace dscpp::model_zoo
