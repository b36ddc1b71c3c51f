// GPT's modules, their initialisation, activation checkpointing of the blocks, and the
// LayerSpec form.
#include "dscpp/model_zoo/gpt.h"

#include <ATen/ops/empty.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <utility>

#include "dscpp/comm/process_group.h"
#include "dscpp/config/config_error.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/fp8_meta.h"
#include "dscpp/nn/linear.h"
#include "dscpp/nn/module_scope.h"
#include "dscpp/nn/normal_init.h"
#include "dscpp/nn/tiled_compute.h"
#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/tiled_cross_entropy.h"

namespace dscpp::model_zoo {

namespace {

void init_zero(const at::Tensor& b) {
  at::NoGradGuard no_grad;
  b.zero_();
}

Linear make_linear(int64_t in, int64_t out, double std, bool bias = true) {
  Linear l(in, out, bias);
  nn::normal_init(l->weight, std);
  if (bias) init_zero(l->bias);
  return l;
}

// An embedding table drawn by normal_init: given as the weight, torch::nn::Embedding skips
// its own (serial) initialisation.
torch::nn::Embedding make_embedding(int64_t rows, int64_t dim, double std) {
  at::Tensor weight = at::empty({rows, dim});
  nn::normal_init(weight, std);
  return torch::nn::Embedding(torch::nn::EmbeddingOptions(rows, dim)._weight(weight));
}

// Every matrix product goes through nn::linear, which saves the weight parameter itself
// for backward, so ZeRO stage 3 can release a layer between its forward and backward.
at::Tensor linear_of(const Linear& l, const at::Tensor& x) {
  return nn::linear(x, l->weight, l->bias);
}

at::Tensor tied_head(const GPTEmbeddingImpl& embedding, const at::Tensor& x) {
  return nn::linear(x, embedding.word->weight);
}

}  // namespace

nn::GroupPtr checked_sequence_group(const GPTConfig& c, const nn::GroupPtr& group,
                                    int64_t tensor_degree) {
  const int64_t p = c.parallelism.sequence_parallel_size;
  const int64_t given = nn::tensor_model_parallel_size(group);
  if (given != p)
    throw ConfigError(
        "parallelism.sequence_parallel_size",
        fmt::format("{}: the GPT needs a sequence-parallel group of {} ranks, got {}", p, p,
                    group ? fmt::format("a group of {}", given) : std::string("none")));
  if (p == 1) return nullptr;
  // The router counts over the sequence group (nn::moe::MoEOptions::sequence_group), one
  // token partition at a time.
  if (c.moe.enabled() && c.parallelism.sequence_parallel)
    throw ConfigError("parallelism.sequence_parallel",
                      fmt::format("MoE layers under both Megatron's sequence parallelism and "
                                  "DeepSpeed-Ulysses ({} ranks) are not implemented: the router "
                                  "takes one token partition; expected false",
                                  p));
  // DeepSpeed's split of heads: whole key/value groups, kv / p a rank and one more on the first
  // kv % p ranks, so the groups need not divide by p; it refuses fewer groups than ranks
  // (a rank would have no head). With tensor parallelism, each tensor rank's.
  const int64_t kv = c.query_groups() / tensor_degree;
  if (kv < p) {
    const bool mha = c.query_groups() == c.num_attention_heads;
    const std::string found = tensor_degree > 1 ? fmt::format("{} ({} / {} tensor ranks)", kv,
                                                              c.query_groups(), tensor_degree)
                                                : std::to_string(kv);
    throw ConfigError(
        mha ? "num_attention_heads" : "num_query_groups",
        fmt::format("DeepSpeed-Ulysses gives each of the {} sequence-parallel ranks "
                    "at least one {}: expected at least {}, found {}",
                    p, mha ? "attention head" : "key/value head (num_query_groups)", p, found));
  }
  if (c.seq_length % p != 0)
    throw ConfigError("seq_length", fmt::format("DeepSpeed-Ulysses splits the sequence over the {} "
                                                "sequence-parallel ranks: expected a multiple of "
                                                "{}, found {}",
                                                p, p, c.seq_length));
  return group;
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias) {
  weight = register_parameter("weight", at::empty({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}));
}

GPTEmbeddingImpl::GPTEmbeddingImpl(const GPTConfig& c, nn::GroupPtr sequence_group_)
    : dropout(c.hidden_dropout), sequence_group(std::move(sequence_group_)) {
  word = register_module("word", make_embedding(c.vocab_size, c.hidden_size, c.init_method_std));
  if (c.position_embedding_type == "learned_absolute")
    position = register_module("position",
                               make_embedding(c.positions(), c.hidden_size, c.init_method_std));
  max_positions = c.positions();
}

at::Tensor GPTEmbeddingImpl::forward(const at::Tensor& input_ids) {
  nn::ModuleScope scope(*this);  // names this module to the flops profiler (module_scope.h)
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.scalar_type() == at::kLong,
              "GPT: expected input_ids of shape [batch, seq] and dtype int64, got ",
              input_ids.sizes(), " ", input_ids.scalar_type());
  // (with sequence parallelism this rank's slice, at its place in the whole sequence)
  const int64_t seq = input_ids.size(1), ranks = nn::tensor_model_parallel_size(sequence_group);
  const int64_t first = seq * nn::tensor_model_parallel_rank(sequence_group);
  TORCH_CHECK(seq * ranks <= max_positions, "GPT: a sequence of ", seq * ranks,
              " tokens is longer than max_position_embeddings (", max_positions, ")");
  if (!position) return at::dropout(word(input_ids), dropout, is_training());  // rope
  at::Tensor positions = at::arange(first, first + seq, input_ids.options());
  return at::dropout(word(input_ids) + position(positions), dropout, is_training());
}

GPTAttentionImpl::GPTAttentionImpl(const GPTConfig& c, nn::GroupPtr sequence_group_)
    : heads(c.num_attention_heads),
      groups(c.query_groups()),
      rotary_dim(c.position_embedding_type == "rope" ? c.rotary_dim() : 0),
      rotary_base(c.rotary_base),
      dropout(c.attention_dropout),
      sequence_group(std::move(sequence_group_)) {
  const int64_t rows = (heads + 2 * groups) * c.head_dim();
  qkv = register_module("qkv",
                        make_linear(c.hidden_size, rows, c.init_method_std, c.add_bias_linear));
  proj = register_module(
      "proj", make_linear(c.hidden_size, c.hidden_size, c.residual_init_std(), c.add_bias_linear));
}

at::Tensor GPTAttentionImpl::forward(const at::Tensor& x) {
  nn::ModuleScope scope(*this);
  const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2);
  // q, k and v as [B,heads,S,head_dim] views of the projection; their gradients land in one
  // contiguous buffer (ops::qkv_heads says why not view/permute/unbind).
  const at::Tensor projected = linear_of(qkv, x);
  std::array<at::Tensor, 3> qkv_heads;
  if (groups == heads) {
    qkv_heads = ops::qkv_heads(projected, heads);
  } else {
    const int64_t d = hidden / heads;
    auto part = [&](int64_t first_head, int64_t n) {
      return projected.narrow(-1, first_head * d, n * d).view({batch, seq, n, d}).transpose(1, 2);
    };
    qkv_heads = {part(0, heads), part(heads, groups), part(heads + groups, groups)};
  }
  // Ulysses: each of q, k, v to the whole sequence for this rank's block of heads (query head
  // i of the block still pairs with key/value head i / (heads / groups) of its block).
  for (auto& t : qkv_heads) t = nn::all_to_all_sequence_to_heads(t, sequence_group, groups);
  if (rotary_dim > 0) {
    qkv_heads[0] = apply_rotary(qkv_heads[0], rotary_dim, rotary_base);
    qkv_heads[1] = apply_rotary(qkv_heads[1], rotary_dim, rotary_base);
  }
  // enable_gqa: SDPA shares each k/v head among heads / groups consecutive query heads.
  at::Tensor y = at::scaled_dot_product_attention(
      qkv_heads[0], qkv_heads[1], qkv_heads[2], /*attn_mask=*/{}, is_training() ? dropout : 0.0,
      /*is_causal=*/true, /*scale=*/std::nullopt, /*enable_gqa=*/groups != heads);
  y = nn::all_to_all_heads_to_sequence(y, sequence_group, groups);
  return linear_of(proj, y.transpose(1, 2).reshape({batch, seq, hidden}));
}

GPTMLPImpl::GPTMLPImpl(const GPTConfig& c)
    : swiglu(c.swiglu),
      approximate(c.gelu_approximation),
      fused(c.bias_gelu_fusion && c.add_bias_linear),
      tiles(c.tiled_mlp_shards) {
  const int64_t f = c.ffn_size();
  fc = register_module(
      "fc", make_linear(c.hidden_size, swiglu ? 2 * f : f, c.init_method_std, c.add_bias_linear));
  proj = register_module("proj",
                         make_linear(f, c.hidden_size, c.residual_init_std(), c.add_bias_linear));
}

at::Tensor GPTMLPImpl::forward(const at::Tensor& x) {
  nn::ModuleScope scope(*this);
  std::vector<at::Tensor> weights = {fc->weight, fc->bias, proj->weight, proj->bias};
  weights.erase(std::remove_if(weights.begin(), weights.end(),
                               [](const at::Tensor& w) { return !w.defined(); }),
                weights.end());
  if (tiles <= 1) return forward_with(x, weights);
  return nn::tiled_compute(
      [this](const at::Tensor& slice, const std::vector<at::Tensor>& w) {
        return forward_with(slice, w);
      },
      x, weights, /*dim=*/1, tiles);
}

at::Tensor GPTMLPImpl::forward_with(const at::Tensor& x,
                                    const std::vector<at::Tensor>& weights) const {
  const bool biased = weights.size() == 4;
  const at::Tensor& fc_w = weights[0];
  const at::Tensor fc_b = biased ? weights[1] : at::Tensor();
  const at::Tensor& proj_w = weights[biased ? 2 : 1];
  const at::Tensor proj_b = biased ? weights[3] : at::Tensor();
  // ops::swiglu: one kernel each way on a GPU (narrow's backward would zero-fill two
  // gradients of fc's output width and add them).
  if (swiglu) return nn::linear(ops::swiglu(nn::linear(x, fc_w, fc_b)), proj_w, proj_b);
  if (!fused) return nn::linear(at::gelu(nn::linear(x, fc_w, fc_b), approximate), proj_w, proj_b);
  return nn::linear(ops::bias_gelu(nn::linear(x, fc_w), fc_b, approximate == "tanh"), proj_w,
                    proj_b);
}

GPTBlockImpl::GPTBlockImpl(const GPTConfig& c, int64_t layer_,
                           const std::shared_ptr<comm::ProcessGroup>& ep_group,
                           const nn::GroupPtr& sequence_group)
    : dropout(c.hidden_dropout),
      fused_add_norm(c.residual_layernorm_fusion),
      layer(layer_),
      fp8(c.fp8_recipe_of(layer_)) {
  ln_1 = register_module("ln_1", make_norm(c));
  attn = register_module("attn", GPTAttention(c, sequence_group));
  ln_2 = register_module("ln_2", make_norm(c));
  if (c.moe.is_moe_layer(layer_)) {
    moe = register_module("mlp", make_moe_mlp(c, ep_group, nullptr, sequence_group));
    moe_l_aux_coeff = moe_l_aux_coeff_of(c);
  } else {
    mlp = register_module("mlp", GPTMLP(c));
  }
  // Delayed scaling's amax histories, one slot per matrix (the submodules above hold them all).
  if (fp8 && fp8->scaling == nn::Fp8Scaling::Delayed)
    fp8_meta = register_module("fp8_meta", nn::Fp8Meta(nn::fp8_products_of(*this), *fp8));
}

at::Tensor GPTBlockImpl::run_mlp(const at::Tensor& x) {
  if (!moe) return mlp(x);
  nn::ModuleScope scope(*moe);
  return run_moe_mlp(*moe, x, moe_l_aux_coeff, is_training(), moe_stats);
}

at::Tensor GPTBlockImpl::forward(const at::Tensor& x) {
  nn::ModuleScope scope(*this);
  nn::Fp8Autocast fp8_scope(fp8, fp8_meta ? fp8_meta.get() : nullptr);
  const at::Tensor branch = at::dropout(attn(apply_norm(*ln_1, x)), dropout, is_training());
  if (!fused_add_norm) {
    const at::Tensor h = x + branch;
    return h + at::dropout(run_mlp(apply_norm(*ln_2, h)), dropout, is_training());
  }
  std::array<at::Tensor, 2> hy;  // {h, ln_2(h)}
  {
    // GPTConfig::validate allows the fusion with LayerNorm only.
    const auto& norm = static_cast<torch::nn::LayerNormImpl&>(*ln_2);
    nn::ModuleScope norm_scope(*ln_2);  // the profiler's tree keeps ln_2 (with the add in it)
    hy = ops::add_layer_norm(x, branch, norm.weight, norm.bias, norm.options.eps());
  }
  return hy[0] + at::dropout(run_mlp(hy[1]), dropout, is_training());
}

GPTImpl::GPTImpl(GPTConfig config, const std::shared_ptr<comm::ProcessGroup>& ep_group,
                 const nn::GroupPtr& sequence_group)
    : config_(std::move(config)) {
  config_.validate();
  const auto group = checked_expert_parallel_group(config_, ep_group);
  const auto sequence = checked_sequence_group(config_, sequence_group);
  embedding = register_module("embedding", GPTEmbedding(config_, sequence));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    block_list_.emplace_back(config_, i, group, sequence);
    blocks->push_back(block_list_.back());
  }
  final_norm = register_module("final_norm", make_norm(config_));
  if (!config_.tie_word_embeddings)
    head = register_module(
        "head", make_linear(config_.hidden_size, config_.vocab_size, config_.init_method_std,
                            /*bias=*/false));
  if (config_.checkpoint_activations) enable_activation_checkpointing();
}

at::Tensor GPTImpl::forward(const at::Tensor& input_ids, const at::Tensor& targets) {
  if (!targets.defined() || config_.tiled_logits_loss_shards <= 1) {
    at::Tensor logits;
    {
      nn::ModuleScope scope(*this);  // (the loss outside it, as a training loop computes it)
      const at::Tensor x = hidden(input_ids);
      logits = head ? linear_of(head, x) : tied_head(*embedding, x);
    }
    return targets.defined() ? loss(logits, targets) : logits;
  }
  nn::ModuleScope scope(*this);
  const at::Tensor x = hidden(input_ids);
  TORCH_CHECK(targets.sizes() == input_ids.sizes(), "GPT: expected targets of input_ids' shape ",
              input_ids.sizes(), ", got ", targets.sizes());
  return ops::tiled_cross_entropy(x.reshape({-1, x.size(-1)}),
                                  head ? head->weight : embedding->word->weight,
                                  targets.reshape({-1}), config_.tiled_logits_loss_shards);
}

at::Tensor GPTImpl::hidden(const at::Tensor& input_ids) {
  at::Tensor x = embedding(input_ids);
  if (segments_ > 0) {
    const auto layers = static_cast<int64_t>(block_list_.size());
    int64_t begin = 0;
    for (int64_t s = 0; s < segments_; ++s) {
      const int64_t len = layers / segments_ + (s < layers % segments_ ? 1 : 0);
      std::vector<GPTBlock> segment(block_list_.begin() + begin, block_list_.begin() + begin + len);
      // The holders keep the blocks alive until backward has recomputed them.
      auto run = [segment = std::move(segment)](const at::Tensor& input) {
        at::Tensor h = input;
        for (const auto& block : segment) h = block.ptr()->forward(h);
        return h;
      };
      x = activation_checkpointing::checkpoint(std::move(run), x, checkpoint_options_);
      begin += len;
    }
  } else {
    for (auto& block : block_list_) x = block(x);
  }
  return apply_norm(*final_norm, x);
}

at::Tensor gpt_loss(const at::Tensor& logits, const at::Tensor& targets, bool fused) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "GPT::loss: expected logits [B,S,V] and targets [B,S], got ", logits.sizes(), " and ",
              targets.sizes());
  if (fused) return ops::cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(2)}).to(at::kFloat),
                                targets.reshape({-1}));
}

at::Tensor sequence_slice(const at::Tensor& tokens, const nn::GroupPtr& sequence_group) {
  const int p = nn::tensor_model_parallel_size(sequence_group);
  if (p == 1) return tokens;
  if (tokens.dim() != 2 || tokens.size(1) % p != 0)
    throw ConfigError("parallelism.sequence_parallel_size",
                      fmt::format("a batch of shape [{}] does not split into {} slices of its "
                                  "sequence",
                                  fmt::join(tokens.sizes(), ", "), p));
  return tokens.chunk(p, 1)[sequence_group->rank()].contiguous();
}

at::Tensor sequence_parallel_loss(const at::Tensor& mean_loss, const at::Tensor& targets,
                                  const nn::GroupPtr& sequence_group) {
  if (nn::tensor_model_parallel_size(sequence_group) == 1) return mean_loss;
  at::Tensor counted, share;
  {
    at::NoGradGuard no_grad;
    counted = targets.ne(-100).sum().to(at::kFloat);
    at::Tensor total = counted.clone();
    sequence_group->all_reduce(total).wait();
    share = (counted / total.clamp_min(1)).to(mean_loss.dtype());
  }
  // (a slice with nothing counted holds no share: its mean is NaN, the share 0)
  return at::where(counted > 0, mean_loss * share, at::zeros_like(mean_loss));
}

at::Tensor GPTImpl::loss(const at::Tensor& logits, const at::Tensor& targets) const {
  return gpt_loss(logits, targets, config_.cross_entropy_loss_fusion);
}

std::vector<std::string> GPTImpl::enable_activation_checkpointing(
    const ActivationCheckpointingConfig& section) {
  const int64_t layers = config_.num_layers;
  const int64_t segments = section.number_checkpoints.value_or(layers);
  if (segments < 1 || segments > layers)
    throw ConfigError("activation_checkpointing.number_checkpoints",
                      fmt::format("expected an integer in [1, {}] (the model's num_layers: how "
                                  "many checkpointed segments its blocks form), found {}",
                                  layers, segments));
  std::vector<std::string> notes;
  checkpoint_options_ = activation_checkpointing::options_from_config(section, &notes);
  segments_ = segments;
  for (const auto& note : notes) std::cerr << "dscpp: warning: " << note << "\n";
  return notes;
}

std::vector<MoELayerStats> take_moe_stats(torch::nn::Module& root) {
  std::vector<MoELayerStats> out;
  auto take = [&out](auto* block) {
    if (!block || !block->moe) return;
    out.push_back(std::move(block->moe_stats));
    out.back().layer = block->layer;
    block->moe_stats = MoELayerStats{};
  };
  for (const auto& m : root.modules()) {
    take(dynamic_cast<GPTBlockImpl*>(m.get()));
    take(dynamic_cast<TensorParallelGPTBlockImpl*>(m.get()));
  }
  return out;
}

std::vector<nn::LayerSpec> gpt_layer_specs(
    const GPTConfig& config, const std::shared_ptr<comm::ProcessGroup>& ep_group,
    const nn::GroupPtr& sequence_group,
    const activation_checkpointing::Options& checkpoint_options) {
  config.validate();
  const auto group = checked_expert_parallel_group(config, ep_group);
  const auto sequence = checked_sequence_group(config, sequence_group);
  std::vector<nn::LayerSpec> specs;
  const bool tied = config.tie_word_embeddings;
  auto build_embedding = [config, sequence] { return GPTEmbedding(config, sequence).ptr(); };
  specs.push_back({"embedding", build_embedding,
                   [](torch::nn::Module& m, const at::Tensor& ids) {
                     return static_cast<GPTEmbeddingImpl&>(m).forward(ids);
                   },
                   tied ? "embedding" : "",
                   tied ? std::vector<std::string>{"word.weight"} : std::vector<std::string>{}});
  // checkpoint_activations: each block is its own checkpointed segment, as DeepSpeed's
  // PipelineModule(activation_checkpoint_interval=1) makes them.
  const bool checkpointed = config.checkpoint_activations;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    specs.push_back(
        {fmt::format("blocks.{}", i),
         [config, i, group, sequence] { return GPTBlock(config, i, group, sequence).ptr(); },
         [checkpointed, checkpoint_options](torch::nn::Module& m, const at::Tensor& x) {
           auto& block = static_cast<GPTBlockImpl&>(m);
           if (!checkpointed) return block.forward(x);
           return activation_checkpointing::checkpoint(
               [&block](const at::Tensor& in) { return block.forward(in); }, x, checkpoint_options);
         },
         "",
         {}});
  }
  specs.push_back({"final_norm",
                   [config] { return make_norm(config); },
                   [](torch::nn::Module& m, const at::Tensor& x) { return apply_norm(m, x); },
                   "",
                   {}});
  if (tied) {
    specs.push_back({"head",
                     build_embedding,
                     [](torch::nn::Module& m, const at::Tensor& x) {
                       return tied_head(static_cast<GPTEmbeddingImpl&>(m), x);
                     },
                     "embedding",
                     {"word.weight"}});
  } else {
    specs.push_back({"head",
                     [config] {
                       return make_linear(config.hidden_size, config.vocab_size,
                                          config.init_method_std, /*bias=*/false)
                           .ptr();
                     },
                     [](torch::nn::Module& m, const at::Tensor& x) {
                       auto& head = static_cast<LinearImpl&>(m);
                       return nn::linear(x, head.weight, head.bias);
                     },
                     "",
                     {}});
  }
  // The tiled loss, as GPT::forward(input_ids, targets) computes it: the head's weight is
  // gathered for this layer like any other (ZeRO-3), the logits one tile at a time.
  if (config.tiled_logits_loss_shards > 1) {
    const int64_t shards = config.tiled_logits_loss_shards;
    specs.back().forward_loss = [tied, shards](torch::nn::Module& m, const at::Tensor& x,
                                               const at::Tensor& targets) {
      const at::Tensor& weight = tied ? static_cast<GPTEmbeddingImpl&>(m).word->weight
                                      : static_cast<LinearImpl&>(m).weight;
      return ops::tiled_cross_entropy(x.reshape({-1, x.size(-1)}), weight, targets.reshape({-1}),
                                      shards);
    };
  }
  return specs;
}

}  // namespace dscpp::model_zoo
