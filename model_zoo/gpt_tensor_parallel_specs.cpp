// The tensor-parallel GPT as pipeline LayerSpecs: see gpt_tensor_parallel_specs.h. The names,
// order and tying are gpt_layer_specs' (gpt.cpp), so a pipeline of either holds its parameters
// under the same names and a layer seeded alike draws the same master weights.
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dscpp/config/config_error.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/activation_checkpointing.h"
#include "dscpp/nn/vocab_parallel_cross_entropy.h"

namespace dscpp::model_zoo {

std::vector<nn::LayerSpec> tensor_parallel_gpt_layer_specs(const GPTConfig& config,
                                                           nn::GroupPtr group,
                                                           const nn::GroupPtr& ep_group,
                                                           const nn::GroupPtr& sequence_group) {
  config.validate();
  validate_tensor_parallel(config, nn::tensor_model_parallel_size(group));
  const auto sequence =
      checked_sequence_group(config, sequence_group, nn::tensor_model_parallel_size(group));
  // Said here too (validate_tensor_parallel says it for TensorParallelGPT): a pipeline stage's
  // MoE block would receive the sequence shard between stages.
  if (config.moe.enabled() && config.parallelism.sequence_parallel)
    throw ConfigError("parallelism.sequence_parallel",
                      "expected false with num_experts in the tensor-parallel GPT's LayerSpec "
                      "form (a pipeline's MoE blocks take their input whole on every tensor "
                      "rank), found true");
  const auto experts = checked_expert_parallel_group(config, ep_group);
  std::vector<nn::LayerSpec> specs;
  const bool tied = config.tie_word_embeddings;
  // With sequence parallelism the activation between layers (and between stages) is this
  // rank's [S/t, B, h] from the embedding's scatter to the head's gather: each model rank
  // sends its shard to the same model rank of the next stage.
  auto build_embedding = [config, group, sequence] {
    return TensorParallelGPTEmbedding(config, group, sequence).ptr();
  };
  specs.push_back({"embedding", build_embedding,
                   [config, group](torch::nn::Module& m, const at::Tensor& ids) {
                     return to_block_layout(
                         static_cast<TensorParallelGPTEmbeddingImpl&>(m).forward(ids), config,
                         group);
                   },
                   tied ? "embedding" : "",
                   tied ? std::vector<std::string>{"word.weight"} : std::vector<std::string>{}});
  // checkpoint_activations: each block is its own checkpointed segment, as gpt_layer_specs'
  // (the recompute restores the RNG tracker's states too, so split-region dropout agrees).
  const bool checkpointed = config.checkpoint_activations;
  for (int64_t i = 0; i < config.num_layers; ++i)
    specs.push_back({fmt::format("blocks.{}", i),
                     [config, group, i, experts, sequence] {
                       return TensorParallelGPTBlock(config, group, i, experts, sequence).ptr();
                     },
                     [checkpointed](torch::nn::Module& m, const at::Tensor& x) {
                       auto& block = static_cast<TensorParallelGPTBlockImpl&>(m);
                       if (!checkpointed) return block.forward(x);
                       return activation_checkpointing::checkpoint(
                           [&block](const at::Tensor& in) { return block.forward(in); }, x);
                     },
                     "",
                     {}});
  const bool sp = config.parallelism.sequence_parallel;
  specs.push_back(
      {"final_norm",
       [config, sp] { return std::make_shared<SequenceParallelLayerNormImpl>(config, sp); },
       [](torch::nn::Module& m, const at::Tensor& x) {
         return static_cast<SequenceParallelLayerNormImpl&>(m).forward(x);
       },
       "",
       {}});
  if (tied) {
    specs.push_back({"head",
                     build_embedding,
                     [config, group](torch::nn::Module& m, const at::Tensor& x) {
                       auto& e = static_cast<TensorParallelGPTEmbeddingImpl&>(m);
                       return tensor_parallel_gpt_logits(x, e.word->weight, nullptr, config, group);
                     },
                     "embedding",
                     {"word.weight"}});
  } else {
    specs.push_back({"head",
                     [config, group] { return untied_parallel_head(config, group).ptr(); },
                     [config, group](torch::nn::Module& m, const at::Tensor& x) {
                       return tensor_parallel_gpt_logits(
                           x, {}, &static_cast<nn::ColumnParallelLinearImpl&>(m), config, group);
                     },
                     "",
                     {}});
  }
  return specs;
}

at::Tensor tensor_parallel_gpt_loss(const at::Tensor& logits_parallel, const at::Tensor& targets,
                                    const nn::GroupPtr& group) {
  TORCH_CHECK(logits_parallel.dim() == 3 && targets.dim() == 2 &&
                  logits_parallel.size(0) == targets.size(0) &&
                  logits_parallel.size(1) == targets.size(1),
              "tensor_parallel_gpt_loss: expected logits [B,S,V/t] and targets [B,S], got ",
              logits_parallel.sizes(), " and ", targets.sizes());
  // PyTorch's ignore_index: tokens of -100 neither count nor divide.
  const at::Tensor counted = targets != -100;
  const at::Tensor per_token =
      nn::vocab_parallel_cross_entropy(logits_parallel, at::where(counted, targets, 0), group);
  return (per_token * counted).sum() / counted.sum();
}

}  // namespace dscpp::model_zoo
