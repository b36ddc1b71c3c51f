// GPTConfig: the shape of a decoder-only transformer (GPT-2 / Megatron style), read from a JSON
// or YAML file with the key names practitioners use. Reading is strict by default: a missing
// required key, a wrong type or range, or an unknown key is a ConfigError naming the key and what
// was expected (and, from a YAML file, its line:column).
//
// Two shapes of file: flat (the model's keys at the root, `parallelism` beside them), or
// sectioned as the seed writes its YAML: a `model:` section with the model's keys and a
// `parallelism:` section (ParallelismConfig); any other section is an error that lists the
// known ones. `hidden_size`, `num_layers`, `num_attention_heads` and `seq_length` suffice; the
// rest default as Megatron-LM's arguments do: FFN 4h, positions = seq_length, and without
// `vocab_size` GPT-2's 50257 tokens padded to a multiple of `make_vocab_size_divisible_by`
// (128): 50304. Megatron pads to 128 x the tensor-parallel degree; we pad to 128 alone, so that
// the embedding has one shape at every tensor-parallel degree and a checkpoint reshapes exactly.
// The parameter count and training FLOPs per token are computed from the shape alone, so they are
// available for models too large to build.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/model_zoo/moe_config.h"
#include "dscpp/model_zoo/parallelism_config.h"
#include "dscpp/nn/fp8_recipe.h"

namespace dscpp::model_zoo {

struct GPTConfig {
  int64_t hidden_size = 0;              // width of the residual stream (required)
  int64_t num_layers = 0;               // transformer blocks (required)
  int64_t num_attention_heads = 0;      // divides hidden_size (required)
  int64_t seq_length = 0;               // training sequence length (seq_length or
                                        // max_position_embeddings is required)
  int64_t max_position_embeddings = 0;  // rows of the position table; seq_length when absent
  int64_t vocab_size = 0;  // rows of the token embedding; GPT-2's padded (50304) when absent
  int64_t make_vocab_size_divisible_by = 128;  // the padding of the default vocab_size
  int64_t ffn_hidden_size = 0;     // MLP width; 4 * hidden_size when absent (swiglu: see ffn_size)
  double hidden_dropout = 0.1;     // after the embeddings and each residual branch; 0: off
  double attention_dropout = 0.1;  // on the attention probabilities; 0: off
  double layernorm_epsilon = 1e-5;
  double init_method_std = 0.02;    // std of the normal initialisation
  bool tie_word_embeddings = true;  // the output head multiplies by the token embedding (Megatron:
                                    // untie_embeddings_and_output_weights, its negation)
  // Current-model blocks, with Megatron-LM's names; the defaults are GPT-2's blocks.
  std::string normalization = "LayerNorm";                   // or "RMSNorm" (weight only, no bias)
  std::string position_embedding_type = "learned_absolute";  // or "rope" (no position table)
  double rotary_base = 10000;    // rope: inverse frequencies base^(-2i/rotary_dim)
  double rotary_percent = 1.0;   // rope: rotary_dim = int(head_dim * rotary_percent), even
  bool swiglu = false;           // MLP silu(x W_gate) * (x W_up): fc holds [gate; up], 2 x ffn rows
  int64_t num_query_groups = 0;  // key/value heads (grouped-query attention); heads when absent
  bool add_bias_linear = true;   // biases on qkv, proj, fc (false: Llama-style)
  std::string gelu_approximation = "tanh";  // "tanh" (GPT-2, the default) or "none" (exact erf)
  bool checkpoint_activations = false;      // checkpoint each transformer block (Megatron's flag)
  // Megatron's fusion flags: the MLP's bias add and GELU in one kernel, and the loss's
  // cross entropy read straight from the 16-bit logits (ops; an exact ATen path
  // where no kernel applies). false: eager LibTorch ops, the reference.
  bool bias_gelu_fusion = true;
  bool cross_entropy_loss_fusion = true;
  // Long sequences: the loss computed in this many tiles of tokens, the whole logits never held
  // (ops::tiled_cross_entropy, DeepSpeed ALST's TiledFusedLogitsLoss `shards`); 1: off. With
  // the GPT module (the engine at ZeRO 0-2), through GPT::forward(input_ids, targets).
  int64_t tiled_logits_loss_shards = 1;
  // Long sequences: each dense block's MLP computed in this many tiles of the sequence, one
  // tile's inner activations alive at a time (nn::tiled_compute, ALST's TiledMLP); 1: off.
  // Not with fp8 (its scope is forward's) nor in MoE blocks.
  int64_t tiled_mlp_shards = 1;
  // Each block's second residual add and the LayerNorm it feeds (ln_2) in one kernel, forward
  // and backward (ops::add_layer_norm); false: the eager add, then torch's layer_norm. A config
  // file turns it on by default where normalization is LayerNorm (from_json: +0.8% on the 1.3 B
  // step, docs/perf-log/2026-12-02.md), off with RMSNorm (no fused kernel); off in a default-built
  // struct.
  bool residual_layernorm_fusion = false;
  // Megatron's gradient_accumulation_fusion: the linears' weight-gradient products write into
  // ZeRO's gradient buckets (ops/grad_destination.h); false: through autograd, then copied in.
  // Process-wide: the program applies it (ops::set_gradient_accumulation_fusion). A runtime
  // path only (the same gradients): not written by to_json().
  bool gradient_accumulation_fusion = true;
  // FP8 for the blocks' linear products (nn/fp8_linear.h), with Megatron-Core's key names:
  // fp8 "hybrid" or "e4m3" (absent: off), fp8_recipe "tensorwise" (torchao's default),
  // "rowwise" (torchao's) or "delayed" (Transformer Engine's), fp8_margin. With
  // first_last_layers_bf16 the first num_layers_at_start_in_bf16 and the last
  // num_layers_at_end_in_bf16 blocks stay bf16; on by default (Megatron's default is off), as the
  // peers' FP8 recipes keep those layers. The embedding and the output head are always bf16.
  std::string fp8;
  std::string fp8_recipe = "tensorwise";
  int64_t fp8_margin = 0;
  // fp8_recipe "delayed" (nn/fp8_meta.h), with Megatron's defaults: the steps of amax history
  // kept per operand, and "most_recent" or "max" of it for the scale.
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";
  bool first_last_layers_bf16 = true;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  // The mixture-of-experts keys (Megatron's num_experts, moe_*; moe_config.h); dense when
  // num_experts is absent.
  MoEConfig moe;
  // The job's tensor, pipeline and data degrees (the `parallelism` object); all 1 when absent.
  ParallelismConfig parallelism;
  std::vector<std::string> warnings;  // unknown keys, when read with strict = false

  // GPT-2's tokenizer's vocabulary, the default before padding.
  static constexpr int64_t kGPT2VocabSize = 50257;
  // The sections of a sectioned config.
  static constexpr const char* kSections[] = {"model", "parallelism"};
  // `vocab` rounded up to a multiple of `multiple` (Megatron's _vocab_size_with_padding at t = 1).
  static int64_t padded_vocab_size(int64_t vocab, int64_t multiple);

  // `strict` = false turns unknown keys into entries of `warnings` (for configs written for
  // other tools, e.g. Hugging Face's config.json with its extra keys).
  static GPTConfig from_json(const nlohmann::json& json, bool strict = true);
  // A JSON file (comments and trailing commas allowed, as for ds_config), or YAML (*.yaml, *.yml).
  static GPTConfig from_file(const std::string& path, bool strict = true);
  // Every value under the keys from_json reads: from_json(to_json()) is the same config.
  nlohmann::json to_json() const;

  // Throws ConfigError when the shape is inconsistent (from_json calls it).
  void validate() const;
  // The MoE keys' checks against the rest of the model and the expert degree (validate's).
  void validate_moe() const;

  // The FP8 recipe block `layer` multiplies with; nullopt: bf16 (fp8 off, or a kept layer).
  std::optional<nn::Fp8Recipe> fp8_recipe_of(int64_t layer) const;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Megatron's default with swiglu: int(4h * 2/3 / 64) * 64, which keeps the two input
  // projections near the 4h MLP's parameter count.
  int64_t ffn_size() const {
    if (ffn_hidden_size > 0) return ffn_hidden_size;
    return swiglu ? 4 * hidden_size * 2 / 3 / 64 * 64 : 4 * hidden_size;
  }
  // The std of the residual branches' output projections (Megatron's output_layer_init_method):
  // init_method_std / sqrt(2 num_layers). Each branch's output adds to the stream once per
  // block: scaling them keeps the stream's variance independent of depth (GPT-2).
  double residual_init_std() const;
  int64_t query_groups() const {
    return num_query_groups > 0 ? num_query_groups : num_attention_heads;
  }
  // Even, at most head_dim: the leading channels of each head that rope rotates.
  int64_t rotary_dim() const;
  // The first key (in this list's order: normalization, position_embedding_type, swiglu,
  // num_query_groups, add_bias_linear, num_experts) whose value is not GPT-2's block; "" for a
  // GPT-2 model.
  // For the paths that implement only GPT-2's blocks, to refuse the others by name.
  std::string first_non_gpt2_block_key() const;
  int64_t positions() const {
    return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
  }
  // The routed experts' FFN width (moe_ffn_hidden_size, or ffn_size()).
  int64_t moe_ffn_size() const {
    return moe.moe_ffn_hidden_size > 0 ? moe.moe_ffn_hidden_size : ffn_size();
  }
  // Trainable parameters of GPT(config), tied weights counted once; an MoE layer counts all
  // its experts (the router's expert_bias is a buffer, not counted).
  int64_t num_parameters() const;
  // The parameters one token's forward uses: num_parameters() with each MoE layer's routed
  // experts counted moe_router_topk times instead of num_experts times (dropless routing;
  // with a capacity factor dropped routes use fewer). Equal to num_parameters() when dense.
  int64_t active_parameters() const;
  // The routed experts' weights of every MoE layer (what expert parallelism splits): 0 when
  // dense.
  int64_t routed_expert_parameters() const;
  // Training FLOPs per token at `seq` (default seq_length): 6N for the forward and backward
  // matrix products over the N ACTIVE parameters (the tied head's product counts through the
  // embedding; an MoE layer's router, its top-k experts, shared expert and latent
  // projections) plus 12 * L * h * seq for attention's scores and weighted sums (PaLM's
  // formula, without activation recomputation).
  double flops_per_token(int64_t seq = 0) const;
};

}  // namespace dscpp::model_zoo
