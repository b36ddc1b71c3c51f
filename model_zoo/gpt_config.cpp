// GPTConfig: reading, validation and the analytic counts.
#include "dscpp/model_zoo/gpt_config.h"

#include <fmt/format.h>

#include <cmath>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_bounds.h"
#include "dscpp/config/json_text.h"
#include "dscpp/config/section.h"

namespace dscpp::model_zoo {

using config::Section;
using nlohmann::json;

namespace {

// Bounds on every dimension, far above any real model (the 535B layout: h 20480, 120 layers),
// so that the parameter count and FLOPs (about 12 L h^2 + 2 L h f + V h) stay inside int64:
// at the bounds 2^16 * (4 * 2^36 + 2 * 2^18 * 2^22) + 2^28 * 2^18 is under 2^59.
constexpr int64_t kMaxWidth = int64_t{1} << 18;    // hidden_size
constexpr int64_t kMaxFfn = int64_t{1} << 22;      // ffn_hidden_size
constexpr int64_t kMaxLayers = int64_t{1} << 16;   // num_layers
constexpr int64_t kMaxRows = int64_t{1} << 28;     // vocab_size, positions
constexpr int64_t kMaxDivisor = int64_t{1} << 20;  // make_vocab_size_divisible_by

int64_t required_int(Section& s, const std::string& key, int64_t max) {
  auto v = s.get_opt_int(key, 1, max);
  if (!v) throw ConfigError(s.path_of(key), "required key missing: expected an integer >= 1");
  return *v;
}

// The one spelling of a value that has several in the wild; two spellings at once are an
// error, since they may disagree.
std::string spelling(Section& s, std::initializer_list<const char*> names) {
  std::string found;
  for (const char* name : names) {
    s.raw(name);  // marks every spelling as known
    if (!s.has(name)) continue;
    if (!found.empty())
      throw ConfigError(
          s.path_of(name),
          fmt::format("the same value as '{}': give only one of them", s.path_of(found)));
    found = name;
  }
  return found.empty() ? *names.begin() : found;
}

}  // namespace

namespace {

// The model's own keys, in `s` (the root of a flat config, or its `model` section).
void read_model_keys(Section& s, GPTConfig& c) {
  c.hidden_size = required_int(s, "hidden_size", kMaxWidth);
  c.num_layers = required_int(s, "num_layers", kMaxLayers);
  c.num_attention_heads = required_int(s, "num_attention_heads", kMaxWidth);
  c.make_vocab_size_divisible_by =
      s.get_int("make_vocab_size_divisible_by", c.make_vocab_size_divisible_by, 1, kMaxDivisor);
  c.vocab_size = s.get_int(
      "vocab_size",
      GPTConfig::padded_vocab_size(GPTConfig::kGPT2VocabSize, c.make_vocab_size_divisible_by), 1,
      kMaxRows);
  auto seq = s.get_opt_int("seq_length", 1, kMaxRows);
  auto positions = s.get_opt_int("max_position_embeddings", 1, kMaxRows);
  if (!seq && !positions)
    throw ConfigError(
        s.path_of("seq_length"),
        "required key missing: expected an integer >= 1 (or max_position_embeddings)");
  c.seq_length = seq ? *seq : *positions;
  c.max_position_embeddings = positions ? *positions : *seq;
  c.swiglu = s.get_bool("swiglu", c.swiglu);
  c.ffn_hidden_size = s.get_int("ffn_hidden_size", c.ffn_size(), 1, kMaxFfn);
  c.normalization = s.get_choice("normalization", c.normalization, {"LayerNorm", "RMSNorm"});
  c.position_embedding_type = s.get_choice("position_embedding_type", c.position_embedding_type,
                                           {"learned_absolute", "rope"});
  c.rotary_base = s.get_double("rotary_base", c.rotary_base, 0.0);
  c.rotary_percent = s.get_double("rotary_percent", c.rotary_percent, 0.0, 1.0);
  c.num_query_groups =
      s.get_int("num_query_groups", c.num_attention_heads, 1, c.num_attention_heads);
  c.add_bias_linear = s.get_bool("add_bias_linear", c.add_bias_linear);
  c.hidden_dropout = s.get_double("hidden_dropout", c.hidden_dropout, 0.0, 1.0);
  c.attention_dropout = s.get_double("attention_dropout", c.attention_dropout, 0.0, 1.0);
  c.layernorm_epsilon =
      s.get_double(spelling(s, {"layernorm_epsilon", "layer_norm_epsilon", "layer_norm_eps"}),
                   c.layernorm_epsilon, 0.0);
  c.init_method_std = s.get_double("init_method_std", c.init_method_std, 0.0);
  // Hugging Face's tie_word_embeddings or Megatron's untie_embeddings_and_output_weights.
  if (spelling(s, {"tie_word_embeddings", "untie_embeddings_and_output_weights"}) ==
      "tie_word_embeddings")
    c.tie_word_embeddings = s.get_bool("tie_word_embeddings", c.tie_word_embeddings);
  else
    c.tie_word_embeddings = !s.get_bool("untie_embeddings_and_output_weights", false);
  c.gelu_approximation = s.get_choice("gelu_approximation", c.gelu_approximation, {"tanh", "none"});
  c.checkpoint_activations = s.get_bool("checkpoint_activations", c.checkpoint_activations);
  c.bias_gelu_fusion = s.get_bool("bias_gelu_fusion", c.bias_gelu_fusion);
  c.cross_entropy_loss_fusion =
      s.get_bool("cross_entropy_loss_fusion", c.cross_entropy_loss_fusion);
  c.tiled_logits_loss_shards =
      s.get_int("tiled_logits_loss_shards", c.tiled_logits_loss_shards, 1, int64_t{1} << 30);
  c.tiled_mlp_shards = s.get_int("tiled_mlp_shards", c.tiled_mlp_shards, 1, int64_t{1} << 30);
  // On by default where its kernel applies (LayerNorm): the rewritten backward measured +0.8%
  // on the 1.3 B step (docs/perf-log/2026-12-02.md, row d2x1f); RMSNorm has no fused kernel.
  c.residual_layernorm_fusion =
      s.get_bool("residual_layernorm_fusion", c.normalization == "LayerNorm");
  c.gradient_accumulation_fusion =
      s.get_bool("gradient_accumulation_fusion", c.gradient_accumulation_fusion);
  c.fp8 = s.get_choice("fp8", c.fp8, {"hybrid", "e4m3"});
  c.fp8_recipe = s.get_choice("fp8_recipe", c.fp8_recipe, {"tensorwise", "rowwise", "delayed"});
  c.fp8_margin = s.get_int("fp8_margin", c.fp8_margin, 0, 32);
  c.fp8_amax_history_len = s.get_int("fp8_amax_history_len", c.fp8_amax_history_len, 1, 65536);
  c.fp8_amax_compute_algo =
      s.get_choice("fp8_amax_compute_algo", c.fp8_amax_compute_algo, {"most_recent", "max"});
  // Megatron's and torchtitan's FP8 all-gather of ZeRO-3's weights: not here (stage 3 gathers
  // the bf16 weights, and each product casts its own); named, not left as an unknown key.
  if (s.get_bool("fp8_param_gather", false))
    s.fail("fp8_param_gather",
           "false (the all-gather of FP8 weights with precomputed scales is not implemented: "
           "ZeRO-3 gathers the bf16 weights and each FP8 product casts its own)");
  c.first_last_layers_bf16 = s.get_bool("first_last_layers_bf16", c.first_last_layers_bf16);
  c.num_layers_at_start_in_bf16 =
      s.get_int("num_layers_at_start_in_bf16", c.num_layers_at_start_in_bf16, 0);
  c.num_layers_at_end_in_bf16 =
      s.get_int("num_layers_at_end_in_bf16", c.num_layers_at_end_in_bf16, 0);
  read_moe_keys(s, c.num_layers, c.moe);
}

std::string known_sections() {
  std::string list;
  for (const char* name : GPTConfig::kSections)
    list += std::string(list.empty() ? "" : ", ") + name;
  return list;
}

// A config is sectioned when it has a `model` section, or when it has no model key at its root
// but holds objects other than `parallelism` (sections, maybe misspelt): such a file is then
// told about its sections, not that hidden_size is missing.
bool is_sectioned(const json& j) {
  if (j.contains("model")) return true;
  if (j.contains("hidden_size")) return false;
  for (const auto& item : j.items())
    if (item.value().is_object() && item.key() != "parallelism") return true;
  return false;
}

}  // namespace

GPTConfig GPTConfig::from_json(const json& j, bool strict) {
  // A program's JSON is bounded as config text is (depth, UTF-8) before anything walks it.
  config::check_json_bounds(j, "");
  if (!j.is_object()) throw ConfigError("", "a GPT config must be a JSON object");
  config::Diagnostics diag;
  diag.strict = strict;
  GPTConfig c;
  if (is_sectioned(j)) {
    // Unknown sections are errors even when not strict: a misspelt section would silently
    // leave every key in it at its default.
    for (const auto& item : j.items()) {
      bool known = false;
      for (const char* name : kSections) known = known || item.key() == name;
      if (known) continue;
      throw ConfigError(item.key(),
                        item.value().is_object()
                            ? fmt::format("unknown section of a model config (known sections: {})",
                                          known_sections())
                            : fmt::format("a sectioned model config holds its keys in sections: "
                                          "put it under one of them (known sections: {})",
                                          known_sections()));
    }
    const json& model = j["model"];
    if (!model.is_object())
      throw ConfigError("model",
                        "expected an object (hidden_size, num_layers, "
                        "num_attention_heads, seq_length, ...), found " +
                            config::show_value(model));
    Section s(&model, "model", &diag);
    read_model_keys(s, c);
    s.finish();
  } else {
    Section s(&j, "", &diag);
    read_model_keys(s, c);
    s.raw("parallelism");
    s.finish();
  }
  if (j.contains("parallelism"))
    c.parallelism = ParallelismConfig::from_json(j["parallelism"], "parallelism");
  c.warnings = diag.warnings;
  c.validate();
  return c;
}

GPTConfig GPTConfig::from_file(const std::string& path, bool strict) {
  config::KeyPositions positions;
  json j = config::read_config_file(path, &positions);
  try {
    return from_json(j, strict);
  } catch (const ConfigError& e) {
    // Name the file too (a job reads several configs), at the key's line where it is known.
    std::string what = e.what();
    std::string prefix = e.path().empty() ? "" : e.path() + ": ";
    throw ConfigError(e.path(), what.substr(prefix.size()) + " (in " +
                                    config::where_in_file(path, positions, e.path()) + ")");
  }
}

json GPTConfig::to_json() const {
  json j = {{"hidden_size", hidden_size},
            {"num_layers", num_layers},
            {"num_attention_heads", num_attention_heads},
            {"seq_length", seq_length},
            {"max_position_embeddings", positions()},
            {"vocab_size", vocab_size},
            {"make_vocab_size_divisible_by", make_vocab_size_divisible_by},
            {"ffn_hidden_size", ffn_size()},
            {"hidden_dropout", hidden_dropout},
            {"attention_dropout", attention_dropout},
            {"layernorm_epsilon", layernorm_epsilon},
            {"init_method_std", init_method_std},
            {"tie_word_embeddings", tie_word_embeddings},
            {"normalization", normalization},
            {"position_embedding_type", position_embedding_type},
            {"rotary_base", rotary_base},
            {"rotary_percent", rotary_percent},
            {"swiglu", swiglu},
            {"num_query_groups", query_groups()},
            {"add_bias_linear", add_bias_linear},
            {"gelu_approximation", gelu_approximation},
            {"checkpoint_activations", checkpoint_activations},
            {"bias_gelu_fusion", bias_gelu_fusion},
            {"cross_entropy_loss_fusion", cross_entropy_loss_fusion},
            {"tiled_logits_loss_shards", tiled_logits_loss_shards},
            {"tiled_mlp_shards", tiled_mlp_shards},
            {"residual_layernorm_fusion", residual_layernorm_fusion},
            {"fp8_recipe", fp8_recipe},
            {"fp8_margin", fp8_margin},
            {"fp8_amax_history_len", fp8_amax_history_len},
            {"fp8_amax_compute_algo", fp8_amax_compute_algo},
            {"first_last_layers_bf16", first_last_layers_bf16},
            {"num_layers_at_start_in_bf16", num_layers_at_start_in_bf16},
            {"num_layers_at_end_in_bf16", num_layers_at_end_in_bf16},
            {"parallelism", parallelism.to_json()}};
  if (!fp8.empty()) j["fp8"] = fp8;
  moe.to_json(j);
  return j;
}

std::optional<nn::Fp8Recipe> GPTConfig::fp8_recipe_of(int64_t layer) const {
  if (fp8.empty()) return std::nullopt;
  if (first_last_layers_bf16 &&
      (layer < num_layers_at_start_in_bf16 || layer >= num_layers - num_layers_at_end_in_bf16))
    return std::nullopt;
  return nn::fp8_recipe_from(fp8, fp8_recipe, static_cast<int>(fp8_margin),
                             static_cast<int>(fp8_amax_history_len), fp8_amax_compute_algo);
}

void GPTConfig::validate() const {
  auto positive = [](const char* key, int64_t v) {
    if (v < 1) throw ConfigError(key, fmt::format("expected an integer >= 1, found {}", v));
  };
  positive("hidden_size", hidden_size);
  positive("num_layers", num_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("seq_length", seq_length);
  positive("vocab_size", vocab_size);
  if (hidden_size % num_attention_heads != 0)
    throw ConfigError("num_attention_heads",
                      fmt::format("expected a divisor of hidden_size ({}), found {}", hidden_size,
                                  num_attention_heads));
  if (ffn_size() < 1)
    throw ConfigError("ffn_hidden_size",
                      fmt::format("expected an integer >= 1; the swiglu default int(4h * 2/3 / "
                                  "64) * 64 is 0 for hidden_size {}: give ffn_hidden_size",
                                  hidden_size));
  if (query_groups() < 1 || num_attention_heads % query_groups() != 0)
    throw ConfigError("num_query_groups",
                      fmt::format("expected a divisor of num_attention_heads ({}), found {}",
                                  num_attention_heads, query_groups()));
  if (normalization != "LayerNorm" && normalization != "RMSNorm")
    throw ConfigError("normalization", fmt::format("expected one of \"LayerNorm\", \"RMSNorm\", "
                                                   "found \"{}\"",
                                                   normalization));
  if (position_embedding_type != "learned_absolute" && position_embedding_type != "rope")
    throw ConfigError("position_embedding_type",
                      fmt::format("expected one of \"learned_absolute\", \"rope\", found \"{}\"",
                                  position_embedding_type));
  if (position_embedding_type == "rope") {
    if (!(rotary_base > 0.0))
      throw ConfigError("rotary_base", fmt::format("expected a number > 0, found {}", rotary_base));
    if (!(rotary_percent > 0.0 && rotary_percent <= 1.0))
      throw ConfigError("rotary_percent",
                        fmt::format("expected a number in (0, 1], found {}", rotary_percent));
    if (rotary_dim() < 2 || rotary_dim() % 2 != 0)
      throw ConfigError("rotary_percent",
                        fmt::format("expected int(head_dim {} * rotary_percent) to be even and "
                                    ">= 2 (rope rotates pairs of channels), found {}",
                                    head_dim(), rotary_dim()));
  }
  if (residual_layernorm_fusion && normalization != "LayerNorm")
    throw ConfigError("residual_layernorm_fusion",
                      "expected false with normalization \"RMSNorm\" (the fused add and norm is "
                      "a LayerNorm kernel; no RMSNorm one yet), found true");
  if (positions() < seq_length)
    throw ConfigError(
        "max_position_embeddings",
        fmt::format("expected at least seq_length ({}), found {}", seq_length, positions()));
  auto probability = [](const char* key, double p) {
    if (!(p >= 0.0 && p < 1.0))
      throw ConfigError(key, fmt::format("expected a probability in [0, 1), found {}", p));
  };
  probability("hidden_dropout", hidden_dropout);
  probability("attention_dropout", attention_dropout);
  if (!(layernorm_epsilon > 0.0))
    throw ConfigError("layernorm_epsilon",
                      fmt::format("expected a number > 0, found {}", layernorm_epsilon));
  if (!(init_method_std > 0.0))
    throw ConfigError("init_method_std",
                      fmt::format("expected a number > 0, found {}", init_method_std));
  if (gelu_approximation != "tanh" && gelu_approximation != "none")
    throw ConfigError(
        "gelu_approximation",
        fmt::format("expected one of \"tanh\", \"none\", found \"{}\"", gelu_approximation));
  if (tiled_mlp_shards > 1 && !fp8.empty())
    throw ConfigError("tiled_mlp_shards",
                      fmt::format("the tiled MLP computes its tiles again in backward, outside "
                                  "the blocks' fp8 scope: expected 1 with fp8 \"{}\", found {}",
                                  fp8, tiled_mlp_shards));
  validate_moe();
}

void GPTConfig::validate_moe() const {
  moe.validate(num_layers);
  const int64_t ep = parallelism.expert_model_parallel_size;
  if (!moe.enabled()) {
    if (ep > 1)
      throw ConfigError("parallelism.expert_model_parallel_size",
                        fmt::format("{} for a dense model: expected 1 (or give num_experts)", ep));
    return;
  }
  // The bounds on each dimension keep a dense count inside int64; the experts multiply it.
  const double expert_weights =
      static_cast<double>(moe.num_moe_layers()) * static_cast<double>(moe.num_experts) * 3.0 *
      static_cast<double>(moe.expert_width(hidden_size)) * static_cast<double>(moe_ffn_size());
  if (expert_weights > 1e18)
    throw ConfigError(
        "num_experts",
        fmt::format("{} experts of FFN {} in {} layers hold about {:.3g} "
                    "parameters: more than the 10^18 this counts",
                    moe.num_experts, moe_ffn_size(), moe.num_moe_layers(), expert_weights));
  if (moe.num_experts % ep != 0)
    throw ConfigError(
        "parallelism.expert_model_parallel_size",
        fmt::format("expected a divisor of num_experts ({}), found {}", moe.num_experts, ep));
}

int64_t GPTConfig::padded_vocab_size(int64_t vocab, int64_t multiple) {
  return (vocab + multiple - 1) / multiple * multiple;
}

double GPTConfig::residual_init_std() const {
  return init_method_std / std::sqrt(2.0 * static_cast<double>(num_layers));
}

int64_t GPTConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary_percent);
}

std::string GPTConfig::first_non_gpt2_block_key() const {
  if (normalization != "LayerNorm") return "normalization";
  if (position_embedding_type != "learned_absolute") return "position_embedding_type";
  if (swiglu) return "swiglu";
  if (query_groups() != num_attention_heads) return "num_query_groups";
  if (!add_bias_linear) return "add_bias_linear";
  if (moe.enabled()) return "num_experts";
  return "";
}

namespace {

// One MoE layer's parameters beside attention and the norms, with `experts` routed experts:
// the router (E x h), the experts (GroupedMLP: width x fc rows and FFN x width each, no bias),
// the shared expert (the model's MLP at its own FFN width, with bias when add_bias_linear)
// and LatentMoE's two projections (h x latent each, no bias).
int64_t moe_mlp_parameters(const GPTConfig& c, int64_t experts) {
  const int64_t h = c.hidden_size, f = c.moe_ffn_size(), w = c.moe.expert_width(h);
  const int64_t rows = c.swiglu ? 2 * f : f;
  const int64_t bias = c.add_bias_linear ? 1 : 0;
  const int64_t fs = c.moe.moe_shared_expert_intermediate_size;
  const int64_t shared = fs > 0 ? (c.swiglu ? 2 * fs : fs) * (h + bias) + h * (fs + bias) : 0;
  const int64_t latent = c.moe.moe_latent_size > 0 ? 2 * h * w : 0;
  return c.moe.num_experts * h + experts * (w * rows + f * w) + shared + latent;
}

}  // namespace

int64_t GPTConfig::routed_expert_parameters() const {
  if (!moe.enabled()) return 0;
  return moe.num_moe_layers() *
         (moe_mlp_parameters(*this, moe.num_experts) - moe_mlp_parameters(*this, 0));
}

int64_t GPTConfig::active_parameters() const {
  if (!moe.enabled()) return num_parameters();
  const int64_t layers = moe.num_moe_layers();
  return num_parameters() - layers * moe_mlp_parameters(*this, moe.num_experts) +
         layers * moe_mlp_parameters(*this, moe.moe_router_topk);
}

int64_t GPTConfig::num_parameters() const {
  const int64_t h = hidden_size, f = ffn_size(), v = vocab_size;
  const int64_t kv = 2 * query_groups() * head_dim();  // k and v rows of qkv
  const int64_t norm = normalization == "RMSNorm" ? h : 2 * h;
  const int64_t fc_rows = swiglu ? 2 * f : f;
  const int64_t bias = add_bias_linear ? 1 : 0;
  // Per block: two norms, qkv ((h + kv) x h), attention output (h x h), MLP in (fc_rows x h)
  // and out (h x f), each linear with its bias when add_bias_linear.
  const int64_t attention = 2 * norm + (h + kv) * (h + bias) + h * (h + bias);
  const int64_t mlp = fc_rows * (h + bias) + h * (f + bias);
  const int64_t embeddings = v * h + (position_embedding_type == "rope" ? 0 : positions() * h);
  const int64_t final_norm = norm;
  const int64_t head = tie_word_embeddings ? 0 : v * h;
  const int64_t moe_layers = moe.num_moe_layers();
  return embeddings + num_layers * attention + (num_layers - moe_layers) * mlp +
         moe_layers * (moe.enabled() ? moe_mlp_parameters(*this, moe.num_experts) : 0) +
         final_norm + head;
}

double GPTConfig::flops_per_token(int64_t seq) const {
  const double s = static_cast<double>(seq > 0 ? seq : seq_length);
  return 6.0 * static_cast<double>(active_parameters()) +
         12.0 * static_cast<double>(num_layers) * static_cast<double>(hidden_size) * s;
}

}  // namespace dscpp::model_zoo
