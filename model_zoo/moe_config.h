// MoEConfig: the mixture-of-experts keys of a GPT model config, under Megatron-LM's names and
// with its defaults (megatron/training/arguments.py, _add_moe_args). Absent `num_experts` (or
// null, Megatron's None): a dense model, and every other moe_ key is refused, since it would
// have no effect. Present: the blocks that moe_layer_freq selects replace their MLP by the
// MoE layer of nn/moe (router, grouped experts, shared expert, LatentMoE).
//
// Reading lives beside GPTConfig's (gpt_config.cpp calls read_moe_keys); this header has no
// LibTorch, so the config tests and train_gpt --dry-run stay light.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dscpp::config {
class Section;
}

namespace dscpp::model_zoo {

struct MoEConfig {
  int64_t num_experts = 0;          // routed experts of each MoE layer; 0: dense (Megatron's None)
  int64_t moe_router_topk = 2;      // experts per token (Megatron's default 2)
  int64_t moe_ffn_hidden_size = 0;  // each routed expert's FFN width; 0: the model's ffn_size()
  // The shared expert's FFN width: the sum over the shared experts (Megatron: num_shared x
  // each one's FFN); 0: none (Megatron's None). An MLP of the model's kind (SwiGLU or GELU)
  // on the full hidden width, its output added to the routed experts'.
  int64_t moe_shared_expert_intermediate_size = 0;
  double moe_aux_loss_coeff = 0.0;             // the load-balancing loss's weight (Megatron's 0.0)
  double moe_z_loss_coeff = 0.0;               // router z-loss weight; 0: off (Megatron's None)
  bool moe_router_enable_expert_bias = false;  // aux-loss-free balancing (sigmoid scores only)
  double moe_router_bias_update_rate = 1e-3;   // the bias step (DeepSeek-V3's 1e-3)
  // The capacity factor; 0: dropless (Megatron's None, its default). Dropped routes follow
  // Megatron's default drop policy, "probs": an expert keeps its highest-scoring routes.
  double moe_expert_capacity_factor = 0.0;
  // moe_layer_freq, resolved: one entry per layer, true where the layer is MoE. Megatron's int
  // N makes layer i MoE when i % N == 0 (N = 1, the default: every layer); a list of 0/1 of
  // num_layers entries names them one by one ([0, 1, 1, ...]: a first dense layer).
  std::vector<bool> moe_layers;
  int64_t moe_layer_freq = 1;                         // the int form (0 when a list was given)
  std::string moe_router_score_function = "softmax";  // or "sigmoid"
  std::string moe_router_load_balancing_type = "aux_loss";  // or "seq_aux_loss", "none"
  double moe_router_topk_scaling_factor = 1.0;  // combine weights x it (Megatron's None: 1)
  int64_t moe_router_num_groups = 0;            // group-limited routing's groups; 0: off
  int64_t moe_router_group_topk = 0;            // groups a token may use; 0: off
  int64_t moe_latent_size = 0;  // LatentMoE: the experts' width (down/up projections); 0: off

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    return enabled() && layer >= 0 && layer < static_cast<int64_t>(moe_layers.size()) &&
           moe_layers[static_cast<size_t>(layer)];
  }
  int64_t num_moe_layers() const;
  // The width the routed experts work in: the latent size, or the model's hidden size.
  int64_t expert_width(int64_t hidden_size) const {
    return moe_latent_size > 0 ? moe_latent_size : hidden_size;
  }

  // The keys written by to_json(), for the "unknown key" and "no num_experts" checks.
  static const std::vector<std::string>& keys();
  // Adds this config's keys to a model config's JSON (nothing when dense).
  void to_json(nlohmann::json& j) const;
  // Throws ConfigError naming the key when a value is out of range or inconsistent with
  // num_layers / the routing (GPTConfig::validate calls it).
  void validate(int64_t num_layers) const;
};

// Reads the moe keys of a model config section (num_layers already read) into `moe`.
void read_moe_keys(config::Section& s, int64_t num_layers, MoEConfig& moe);

}  // namespace dscpp::model_zoo
