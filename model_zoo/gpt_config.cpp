// GPTConfig: reading, validation and the analytic counts.
#include "dscpp/model_zoo/gpt_config.h"

#include <fmt/format.h>

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
  c.ffn_hidden_size = s.get_int("ffn_hidden_size", 4 * c.hidden_size, 1, kMaxFfn);
  c.hidden_dropout = s.get_double("hidden_dropout", c.hidden_dropout, 0.0, 1.0);
  c.attention_dropout = s.get_double("attention_dropout", c.attention_dropout, 0.0, 1.0);
  c.layernorm_epsilon =
      s.get_double(spelling(s, {"layernorm_epsilon", "layer_norm_epsilon", "layer_norm_eps"}),
                   c.layernorm_epsilon, 0.0);
  c.init_method_std = s.get_double("init_method_std", c.init_method_std, 0.0);
  c.tie_word_embeddings = s.get_bool("tie_word_embeddings", c.tie_word_embeddings);
  c.gelu_approximation = s.get_choice("gelu_approximation", c.gelu_approximation, {"tanh", "none"});
  c.checkpoint_activations = s.get_bool("checkpoint_activations", c.checkpoint_activations);
  c.bias_gelu_fusion = s.get_bool("bias_gelu_fusion", c.bias_gelu_fusion);
  c.cross_entropy_loss_fusion =
      s.get_bool("cross_entropy_loss_fusion", c.cross_entropy_loss_fusion);
  c.residual_layernorm_fusion =
      s.get_bool("residual_layernorm_fusion", c.residual_layernorm_fusion);
  c.gradient_accumulation_fusion =
      s.get_bool("gradient_accumulation_fusion", c.gradient_accumulation_fusion);
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
  return {{"hidden_size", hidden_size},
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
          {"gelu_approximation", gelu_approximation},
          {"checkpoint_activations", checkpoint_activations},
          {"bias_gelu_fusion", bias_gelu_fusion},
          {"cross_entropy_loss_fusion", cross_entropy_loss_fusion},
          {"residual_layernorm_fusion", residual_layernorm_fusion},
          {"parallelism", parallelism.to_json()}};
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
}

int64_t GPTConfig::padded_vocab_size(int64_t vocab, int64_t multiple) {
  return (vocab + multiple - 1) / multiple * multiple;
}

int64_t GPTConfig::num_parameters() const {
  const int64_t h = hidden_size, f = ffn_size(), v = vocab_size;
  // Per block: two LayerNorms (2h each), qkv (3h*h + 3h), attention output (h*h + h),
  // MLP in (h*f + f) and out (f*h + h).
  const int64_t block = 4 * h * h + 2 * h * f + 9 * h + f;
  const int64_t embeddings = v * h + positions() * h;
  const int64_t final_norm = 2 * h;
  const int64_t head = tie_word_embeddings ? 0 : v * h;
  return embeddings + num_layers * block + final_norm + head;
}

double GPTConfig::flops_per_token(int64_t seq) const {
  const double s = static_cast<double>(seq > 0 ? seq : seq_length);
  return 6.0 * static_cast<double>(num_parameters()) +
         12.0 * static_cast<double>(num_layers) * static_cast<double>(hidden_size) * s;
}

}  // namespace dscpp::model_zoo
