// The tensor-parallel GPT as pipeline LayerSpecs: see gpt_tensor_parallel_specs.h. The names,
// order and tying are gpt_layer_specs' (gpt.cpp), so a pipeline of either holds its parameters
// under the same names and a layer seeded alike draws the same master weights.
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dscpp/config/config_error.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/linear_async_communication.h"
#include "dscpp/nn/normal_init.h"
#include "dscpp/nn/tensor_parallel_mappings.h"
#include "dscpp/nn/vocab_parallel_cross_entropy.h"

namespace dscpp::model_zoo {

std::vector<nn::LayerSpec> tensor_parallel_gpt_layer_specs(const GPTConfig& config,
                                                           nn::GroupPtr group) {
  config.validate();
  const int t = nn::tensor_model_parallel_size(group);
  if (config.parallelism.tensor_model_parallel_size != t)
    throw ConfigError("parallelism.tensor_model_parallel_size",
                      fmt::format("expected {} (the size of the model-parallel group given), "
                                  "found {}",
                                  t, config.parallelism.tensor_model_parallel_size));
  if (config.parallelism.sequence_parallel)
    throw ConfigError("parallelism.sequence_parallel",
                      "expected false on a pipeline (the tensor-parallel GPT's LayerSpecs do not "
                      "split the sequence yet), found true");
  if (config.checkpoint_activations)
    throw ConfigError("checkpoint_activations",
                      "expected false (the tensor-parallel GPT does not checkpoint its blocks "
                      "yet; PipelineOptions::activation_checkpoint_interval does), found true");
  std::vector<nn::LayerSpec> specs;
  const bool tied = config.tie_word_embeddings;
  auto build_embedding = [config, group] {
    return TensorParallelGPTEmbedding(config, group).ptr();
  };
  specs.push_back({"embedding", build_embedding,
                   [](torch::nn::Module& m, const at::Tensor& ids) {
                     return static_cast<TensorParallelGPTEmbeddingImpl&>(m).forward(ids);
                   },
                   tied ? "embedding" : "",
                   tied ? std::vector<std::string>{"word.weight"} : std::vector<std::string>{}});
  for (int64_t i = 0; i < config.num_layers; ++i)
    specs.push_back({fmt::format("blocks.{}", i),
                     [config, group] { return TensorParallelGPTBlock(config, group).ptr(); },
                     [](torch::nn::Module& m, const at::Tensor& x) {
                       return static_cast<TensorParallelGPTBlockImpl&>(m).forward(x);
                     },
                     "",
                     {}});
  specs.push_back(
      {"final_norm",
       [config] {
         return torch::nn::LayerNorm(
                    torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layernorm_epsilon))
             .ptr();
       },
       [](torch::nn::Module& m, const at::Tensor& x) {
         return static_cast<torch::nn::LayerNormImpl&>(m).forward(x);
       },
       "",
       {}});
  if (tied) {
    // This rank's vocabulary rows; x enters the region whole, so its gradient (a partial sum
    // over the vocabulary shards) is all-reduced.
    specs.push_back(
        {"head",
         build_embedding,
         [group, async = config.parallelism.async_tensor_model_parallel_allreduce](
             torch::nn::Module& m, const at::Tensor& x) {
           auto& e = static_cast<TensorParallelGPTEmbeddingImpl&>(m);
           if (async)
             return nn::linear_with_async_communication(x, e.word->weight, {}, group, false);
           return nn::linear(nn::copy_to_tensor_model_parallel_region(x, group), e.word->weight);
         },
         "embedding",
         {"word.weight"}});
  } else {
    specs.push_back({"head",
                     [config, group] {
                       return nn::ColumnParallelLinear(
                                  nn::ParallelLinearOptions(config.hidden_size, config.vocab_size)
                                      .bias(false)
                                      .init_method(nn::init_method_normal(config.init_method_std))
                                      .async_tensor_model_parallel_allreduce(
                                          config.parallelism.async_tensor_model_parallel_allreduce),
                                  group)
                           .ptr();
                     },
                     [](torch::nn::Module& m, const at::Tensor& x) {
                       return static_cast<nn::ColumnParallelLinearImpl&>(m).forward(x).first;
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
