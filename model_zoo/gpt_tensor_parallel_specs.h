// The tensor-parallel GPT (gpt_tensor_parallel.h) as pipeline LayerSpecs, for a pipeline with
// a model axis (pipe/parallel_groups.h): gpt_layer_specs' names, order and tying with
// TensorParallelGPT's modules, each built on the model-parallel group:
//   "embedding" (TensorParallelGPTEmbedding: the vocabulary-parallel token embedding, the
//   replicated position embedding), "blocks.<i>" (TensorParallelGPTBlock), "final_norm",
//   "head": tied to the embedding (TiedLayerSpec "embedding", weight "word.weight"), this rank's
//   vocabulary rows times the whole hidden state, or a ColumnParallelLinear [V/t, h] when the
//   embeddings are not tied.
// A layer built after the same seed draws the same master weights as gpt_layer_specs' and
// keeps its slice, so a pipeline seeded per layer starts from the one-rank model's weights.
// Each layer's output is this rank's logits [B,S,V/t] on the last; tensor_parallel_gpt_loss is
// the loss_fn. With parallelism.sequence_parallel the activations from the embedding's output
// to the final norm's are TensorParallelGPT's [S/t,B,h] (what a stage sends to the same model
// rank of the next: 1/t of the whole), final_norm's parameters are sequence_parallel (the
// engine sums their gradients over the model group) and the head all-gathers its input.
// checkpoint_activations: each block a checkpointed segment (nn/activation_checkpointing.h,
// which restores the model-parallel RNG tracker's states for the recompute).
// An MoE config (num_experts): the blocks moe_layer_freq marks are TensorParallelGPT's MoE
// blocks (the router and routed experts replicated over the model group, each tensor rank
// dispatching 1/t of the tokens over its expert-parallel group), drawn as TensorParallelGPT
// draws them, so a pipeline seeded per layer starts from GPT's MoE weights too.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/nn/layer_spec.h"
#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::model_zoo {

// group: the model-parallel group of config.parallelism.tensor_model_parallel_size ranks (null
// for 1); ep_group: an MoE config's expert-parallel group, of
// parallelism.expert_model_parallel_size ranks inside this stage and tensor rank's data group
// (comm::new_expert_groups on the pipe x data x model topology), null at 1; sequence_group:
// DeepSpeed-Ulysses' (TensorParallelGPT's), of ranks of this stage and tensor rank, null at 1
// (each layer's input is then this rank's slice of the sequences, the loss its share:
// sequence_parallel_loss). ConfigError for another degree, sizes that do not divide by t
// (validate_tensor_parallel), or experts with Megatron's sequence parallelism.
std::vector<nn::LayerSpec> tensor_parallel_gpt_layer_specs(
    const GPTConfig& config, nn::GroupPtr group, const nn::GroupPtr& ep_group = nullptr,
    const nn::GroupPtr& sequence_group = nullptr);

// The mean token cross entropy of this rank's logits [B,S,V/t] against targets [B,S] through
// nn::vocab_parallel_cross_entropy on `group`, the logits never gathered (targets of -100 left
// out); the same value on every rank of the group (TensorParallelGPT::loss's).
at::Tensor tensor_parallel_gpt_loss(const at::Tensor& logits_parallel, const at::Tensor& targets,
                                    const nn::GroupPtr& group);

}  // namespace dscpp::model_zoo
