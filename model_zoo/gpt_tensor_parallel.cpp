// The tensor-parallel GPT: GPT's modules with nn's parallel layers in place of the linears
// and the token embedding, drawn in GPT's order.
#include "dscpp/model_zoo/gpt_tensor_parallel.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <utility>

#include "dscpp/config/config_error.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/fp8_meta.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/linear_async_communication.h"
#include "dscpp/nn/normal_init.h"
#include "dscpp/nn/rng_tracker.h"
#include "dscpp/nn/vocab_parallel_cross_entropy.h"
#include "dscpp/ops/fused_ops.h"

namespace dscpp::model_zoo {

namespace {

torch::nn::LayerNorm make_layer_norm(const GPTConfig& c) {
  return torch::nn::LayerNorm(
      torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layernorm_epsilon));
}

nn::ParallelLinearOptions linear_options(const GPTConfig& c, int64_t in, int64_t out, double std) {
  return nn::ParallelLinearOptions(in, out)
      .init_method(nn::init_method_normal(std))
      .sequence_parallel(c.parallelism.sequence_parallel)
      .async_tensor_model_parallel_allreduce(c.parallelism.async_tensor_model_parallel_allreduce)
      .tp_comm_overlap(c.parallelism.tp_comm_overlap)
      .tp_comm_overlap_num_splits(c.parallelism.tp_comm_overlap_num_splits);
}

// Dropout in a region the ranks hold differently (split heads, or a sequence shard) draws
// under the model-parallel tracker's fork, so the masks differ across ranks; in a replicated
// region from the default generator, so they agree.
at::Tensor dropout_in(const at::Tensor& x, double p, bool training, bool split) {
  if (!training || p <= 0) return x;
  if (!split) return at::dropout(x, p, true);
  auto fork = nn::get_cuda_rng_tracker().fork();
  return at::dropout(x, p, true);
}

void check_divides(int64_t value, const char* key, int t) {
  if (value % t != 0)
    throw ConfigError(key, fmt::format("expected a multiple of the tensor-parallel degree {}, "
                                       "found {}",
                                       t, value));
}

}  // namespace

TensorParallelGPTEmbeddingImpl::TensorParallelGPTEmbeddingImpl(const GPTConfig& c,
                                                               nn::GroupPtr group,
                                                               nn::GroupPtr sequence_group_)
    : dropout(c.hidden_dropout), sequence_group(std::move(sequence_group_)) {
  word = register_module("word",
                         nn::VocabParallelEmbedding(c.vocab_size, c.hidden_size, group,
                                                    nn::init_method_normal(c.init_method_std)));
  at::Tensor table = at::empty({c.positions(), c.hidden_size});
  nn::normal_init(table, c.init_method_std);
  position = register_module(
      "position", torch::nn::Embedding(
                      torch::nn::EmbeddingOptions(c.positions(), c.hidden_size)._weight(table)));
}

at::Tensor TensorParallelGPTEmbeddingImpl::forward(const at::Tensor& input_ids) {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == at::kLong,
              "TensorParallelGPT: expected input_ids of shape [batch, seq] and dtype int64, got ",
              input_ids.sizes(), " ", input_ids.scalar_type());
  const int64_t seq = input_ids.size(1), ranks = nn::tensor_model_parallel_size(sequence_group);
  const int64_t first = seq * nn::tensor_model_parallel_rank(sequence_group);
  TORCH_CHECK(seq * ranks <= position->weight.size(0), "TensorParallelGPT: a sequence of ",
              seq * ranks, " tokens is longer than max_position_embeddings (",
              position->weight.size(0), ")");
  at::Tensor positions = at::arange(first, first + seq, input_ids.options());
  return at::dropout(word(input_ids) + position(positions), dropout, is_training());
}

TensorParallelGPTAttentionImpl::TensorParallelGPTAttentionImpl(const GPTConfig& c,
                                                               nn::GroupPtr group,
                                                               nn::GroupPtr sequence_group_)
    : local_heads(c.num_attention_heads / nn::tensor_model_parallel_size(group)),
      dropout(c.attention_dropout),
      sequence_parallel(c.parallelism.sequence_parallel),
      sequence_group(std::move(sequence_group_)) {
  // Stride 3: GPT's qkv rows are all of q, then k, then v; each rank takes its heads of each.
  qkv = register_module(
      "qkv",
      nn::ColumnParallelLinear(
          linear_options(c, c.hidden_size, 3 * c.hidden_size, c.init_method_std).stride(3), group));
  proj = register_module(
      "proj",
      nn::RowParallelLinear(linear_options(c, c.hidden_size, c.hidden_size, c.residual_init_std())
                                .input_is_parallel(true),
                            group));
}

at::Tensor TensorParallelGPTAttentionImpl::forward(const at::Tensor& x) {
  // Sequence parallelism: x is [S/t, B, h] and the column-parallel qkv all-gathers it into
  // [S, B, 3h/t]; the heads want [B, S, ...], and the row-parallel projection takes [S, B, h/t]
  // back (reduce-scattering its output into [S/t, B, h]).
  at::Tensor q = qkv(x).first;
  if (sequence_parallel) q = q.transpose(0, 1);
  const int64_t batch = q.size(0), seq = q.size(1);
  auto heads = ops::qkv_heads(q, local_heads);
  // DeepSpeed-Ulysses: this rank's heads over the whole sequence, a block of them per rank.
  for (auto& t : heads) t = nn::all_to_all_sequence_to_heads(t, sequence_group, local_heads);
  const double p = is_training() ? dropout : 0.0;
  at::Tensor y;
  if (p > 0) {
    // The heads are split: each rank's dropout mask must be its own.
    auto fork = nn::get_cuda_rng_tracker().fork();
    y = at::scaled_dot_product_attention(heads[0], heads[1], heads[2], {}, p, true);
  } else {
    y = at::scaled_dot_product_attention(heads[0], heads[1], heads[2], {}, 0.0, true);
  }
  y = nn::all_to_all_heads_to_sequence(y, sequence_group, local_heads);
  y = y.transpose(1, 2).reshape({batch, seq, -1});
  if (sequence_parallel) y = y.transpose(0, 1);
  return proj(y).first;
}

TensorParallelGPTMLPImpl::TensorParallelGPTMLPImpl(const GPTConfig& c, nn::GroupPtr group)
    : approximate(c.gelu_approximation), fused(c.bias_gelu_fusion) {
  fc = register_module(
      "fc",
      nn::ColumnParallelLinear(
          linear_options(c, c.hidden_size, c.ffn_size(), c.init_method_std).skip_bias_add(fused),
          group));
  proj = register_module(
      "proj",
      nn::RowParallelLinear(linear_options(c, c.ffn_size(), c.hidden_size, c.residual_init_std())
                                .input_is_parallel(true),
                            group));
}

at::Tensor TensorParallelGPTMLPImpl::forward(const at::Tensor& x) {
  auto [h, bias] = fc(x);
  h = fused ? ops::bias_gelu(h, bias, approximate == "tanh") : at::gelu(h, approximate);
  return proj(h).first;
}

TensorParallelGPTBlockImpl::TensorParallelGPTBlockImpl(const GPTConfig& c, nn::GroupPtr group,
                                                       int64_t layer_, const nn::GroupPtr& ep_group,
                                                       const nn::GroupPtr& sequence_group)
    : layer(layer_),
      fp8(c.fp8_recipe_of(layer_)),
      dropout(c.hidden_dropout),
      sequence_parallel(c.parallelism.sequence_parallel),
      fused_add_norm(c.residual_layernorm_fusion) {
  ln_1 = register_module("ln_1", make_layer_norm(c));
  attn = register_module("attn", TensorParallelGPTAttention(c, group, sequence_group));
  ln_2 = register_module("ln_2", make_layer_norm(c));
  if (c.moe.is_moe_layer(layer_)) {
    moe = register_module("mlp", make_moe_mlp(c, ep_group, group, sequence_group));
    moe_l_aux_coeff = moe_l_aux_coeff_of(c);
  } else {
    mlp = register_module("mlp", TensorParallelGPTMLP(c, group));
  }
  // Delayed scaling's amax histories, one slot per matrix (the submodules above hold them all).
  if (fp8 && fp8->scaling == nn::Fp8Scaling::Delayed)
    fp8_meta = register_module("fp8_meta", nn::Fp8Meta(nn::fp8_products_of(*this), *fp8));
}

at::Tensor TensorParallelGPTBlockImpl::run_mlp(const at::Tensor& x) {
  if (!moe) return mlp(x);
  return run_moe_mlp(*moe, x, moe_l_aux_coeff, is_training(), moe_stats);
}

at::Tensor TensorParallelGPTBlockImpl::forward(const at::Tensor& x) {
  // With sequence parallelism x is this rank's [S/t, B, h]: the LayerNorms, the residual adds
  // and the dropouts see only it (the dropout masks then differ across ranks).
  nn::Fp8Autocast fp8_scope(
      fp8,
      fp8_meta ? fp8_meta.get() : nullptr);  // in forward: activation checkpointing's recompute too
  const bool training = is_training();
  const at::Tensor branch = dropout_in(attn(ln_1(x)), dropout, training, sequence_parallel);
  if (!fused_add_norm) {
    const at::Tensor h = x + branch;
    return h + dropout_in(run_mlp(ln_2(h)), dropout, training, sequence_parallel);
  }
  // As GPTBlock: the add and ln_2 in one op (a replicated LayerNorm, so no collective changes).
  const auto hy = ops::add_layer_norm(x, branch, ln_2->weight, ln_2->bias, ln_2->options.eps());
  return hy[0] + dropout_in(run_mlp(hy[1]), dropout, training, sequence_parallel);
}

std::map<std::string, nn::TensorParallelAttr>
TensorParallelGPTBlockImpl::tensor_parallel_attributes() const {
  if (!sequence_parallel) return {};
  nn::TensorParallelAttr sp;
  sp.sequence_parallel = true;
  return {{"ln_1.weight", sp}, {"ln_1.bias", sp}, {"ln_2.weight", sp}, {"ln_2.bias", sp}};
}

std::map<std::string, nn::TensorParallelAttr> TensorParallelGPTImpl::tensor_parallel_attributes()
    const {
  if (!config_.parallelism.sequence_parallel) return {};
  nn::TensorParallelAttr sp;
  sp.sequence_parallel = true;
  return {{"final_norm.weight", sp}, {"final_norm.bias", sp}};
}

TensorParallelGPTImpl::TensorParallelGPTImpl(GPTConfig config, nn::GroupPtr group,
                                             const nn::GroupPtr& expert_parallel_group,
                                             const nn::GroupPtr& sequence_group)
    : config_(std::move(config)), group_(std::move(group)) {
  config_.validate();
  validate_tensor_parallel(config_, nn::tensor_model_parallel_size(group_));
  const auto ep_group = checked_expert_parallel_group(config_, expert_parallel_group);
  const auto sequence =
      checked_sequence_group(config_, sequence_group, nn::tensor_model_parallel_size(group_));
  if (config_.checkpoint_activations)
    throw ConfigError("checkpoint_activations",
                      "expected false (TensorParallelGPT does not checkpoint its blocks yet; "
                      "its LayerSpec form, tensor_parallel_gpt_layer_specs, does), found true");
  embedding = register_module("embedding", TensorParallelGPTEmbedding(config_, group_, sequence));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    block_list_.emplace_back(config_, group_, i, ep_group, sequence);
    blocks->push_back(block_list_.back());
  }
  final_norm = register_module("final_norm", make_layer_norm(config_));
  if (!config_.tie_word_embeddings)
    head = register_module("head", untied_parallel_head(config_, group_));
}

at::Tensor TensorParallelGPTImpl::forward(const at::Tensor& input_ids) {
  at::Tensor x = to_block_layout(embedding(input_ids), config_, group_);
  for (auto& block : block_list_) x = block(x);
  return tensor_parallel_gpt_logits(final_norm(x), embedding->word->weight,
                                    head ? head.get() : nullptr, config_, group_);
}

nn::ColumnParallelLinear untied_parallel_head(const GPTConfig& c, nn::GroupPtr group) {
  return nn::ColumnParallelLinear(
      linear_options(c, c.hidden_size, c.vocab_size, c.init_method_std).bias(false),
      std::move(group));
}

void validate_tensor_parallel(const GPTConfig& c, int t) {
  if (c.tiled_logits_loss_shards > 1)
    throw ConfigError("tiled_logits_loss_shards",
                      fmt::format("the tiled loss is the GPT module's: the tensor-parallel GPT's "
                                  "vocabulary-parallel loss is not tiled; expected 1, found {}",
                                  c.tiled_logits_loss_shards));
  GPTConfig blocks = c;  // GPT-2's blocks, whose MLP may be the MoE layer
  blocks.moe = MoEConfig{};
  const std::string block_key = blocks.first_non_gpt2_block_key();
  if (!block_key.empty())
    throw ConfigError(block_key, fmt::format("expected GPT-2's block (normalization LayerNorm, "
                                             "learned_absolute positions, no swiglu, "
                                             "num_query_groups = num_attention_heads, "
                                             "add_bias_linear true): the tensor-parallel GPT "
                                             "does not implement {} = {} yet",
                                             block_key, c.to_json()[block_key].dump()));
  if (c.parallelism.tensor_model_parallel_size != t)
    throw ConfigError("parallelism.tensor_model_parallel_size",
                      fmt::format("expected {} (the size of the model-parallel group given), "
                                  "found {}",
                                  t, c.parallelism.tensor_model_parallel_size));
  if (c.parallelism.sequence_parallel && t == 1)
    throw ConfigError("parallelism.sequence_parallel",
                      "expected false with tensor_model_parallel_size 1 (sequence parallelism "
                      "splits the sequence across the tensor-parallel ranks), found true");
  if (c.parallelism.sequence_parallel && c.seq_length % t != 0)
    throw ConfigError("seq_length", fmt::format("expected a multiple of the tensor-parallel "
                                                "degree {} (sequence parallelism), found {}",
                                                t, c.seq_length));
  if (c.moe.enabled())
    check_divides(c.moe.moe_shared_expert_intermediate_size, "moe_shared_expert_intermediate_size",
                  t);
  check_divides(c.num_attention_heads, "num_attention_heads", t);
  check_divides(c.ffn_size(), "ffn_hidden_size", t);
  check_divides(c.vocab_size, "vocab_size", t);
}

at::Tensor to_block_layout(const at::Tensor& embedded, const GPTConfig& config,
                           const nn::GroupPtr& group) {
  if (!config.parallelism.sequence_parallel) return embedded;
  return nn::scatter_to_sequence_parallel_region(embedded.transpose(0, 1).contiguous(), group);
}

at::Tensor tensor_parallel_gpt_logits(const at::Tensor& x, const at::Tensor& word_weight,
                                      nn::ColumnParallelLinearImpl* head, const GPTConfig& config,
                                      const nn::GroupPtr& group) {
  const bool sp = config.parallelism.sequence_parallel;
  at::Tensor logits;
  if (head) {
    logits = head->forward(x).first;  // with sp: all-gathers x itself
  } else if (config.parallelism.async_tensor_model_parallel_allreduce) {
    // The tied head as a column-parallel product: its backward overlaps x's gradient
    // reduction (and, with sp, x's all-gather again) with the weight-gradient product.
    logits = nn::linear_with_async_communication(
        x, word_weight, {}, group, sp,
        config.parallelism.tp_comm_overlap ? config.parallelism.tp_comm_overlap_num_splits : 1);
  } else if (sp) {
    // The tied head on the whole sequence: x all-gathered, its gradient (a partial sum over
    // the vocabulary shards) reduce-scattered back.
    logits = nn::linear(nn::gather_from_sequence_parallel_region(x, group, true), word_weight);
  } else {
    // The tied head: this rank's vocabulary rows; x enters the region whole, so its gradient
    // (a partial sum over the vocabulary shards) is all-reduced.
    logits = nn::linear(nn::copy_to_tensor_model_parallel_region(x, group), word_weight);
  }
  return sp ? logits.transpose(0, 1) : logits;  // [B, S, V/t]
}

SequenceParallelLayerNormImpl::SequenceParallelLayerNormImpl(const GPTConfig& c, bool sp)
    : torch::nn::LayerNormImpl(
          torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layernorm_epsilon)),
      sequence_parallel(sp) {}

std::map<std::string, nn::TensorParallelAttr>
SequenceParallelLayerNormImpl::tensor_parallel_attributes() const {
  if (!sequence_parallel) return {};
  nn::TensorParallelAttr attr;
  attr.sequence_parallel = true;
  return {{"weight", attr}, {"bias", attr}};
}

at::Tensor TensorParallelGPTImpl::loss(const at::Tensor& logits_parallel,
                                       const at::Tensor& targets) const {
  TORCH_CHECK(logits_parallel.dim() == 3 && targets.dim() == 2 &&
                  logits_parallel.size(0) == targets.size(0) &&
                  logits_parallel.size(1) == targets.size(1),
              "TensorParallelGPT::loss: expected logits [B,S,V/t] and targets [B,S], got ",
              logits_parallel.sizes(), " and ", targets.sizes());
  // PyTorch's ignore_index: tokens of -100 neither count nor divide.
  const at::Tensor counted = targets != -100;
  const at::Tensor per_token =
      nn::vocab_parallel_cross_entropy(logits_parallel, at::where(counted, targets, 0), group_);
  return (per_token * counted).sum() / counted.sum();
}

}  // namespace dscpp::model_zoo
