// MoEConfig: reading the Megatron moe keys, their checks, and writing them back.
#include "dscpp/model_zoo/moe_config.h"

#include <fmt/format.h>

#include "dscpp/config/config_error.h"
#include "dscpp/config/section.h"

namespace dscpp::model_zoo {

using nlohmann::json;

namespace {

constexpr int64_t kMaxExperts = int64_t{1} << 16;
constexpr int64_t kMaxExpertFfn = int64_t{1} << 22;    // as GPTConfig's ffn_hidden_size
constexpr int64_t kMaxLatentWidth = int64_t{1} << 18;  // as GPTConfig's hidden_size

// Megatron's None: a key written as null is the key left out.
bool given(config::Section& s, const std::string& key) {
  const json* v = s.raw(key);
  return v != nullptr && !v->is_null();
}

// moe_layer_freq: an int N (layer i is MoE when i % N == 0) or a list of num_layers 0/1.
void read_layer_freq(config::Section& s, int64_t num_layers, MoEConfig& m) {
  const std::string key = "moe_layer_freq";
  const json* v = s.raw(key);
  m.moe_layers.assign(static_cast<size_t>(num_layers), false);
  if (v == nullptr || v->is_null() || v->is_number()) {
    m.moe_layer_freq = s.get_int(key, 1, 1, num_layers);
    for (int64_t i = 0; i < num_layers; i += m.moe_layer_freq)
      m.moe_layers[static_cast<size_t>(i)] = true;
    return;
  }
  const auto fail = [&](const std::string& what) {
    throw ConfigError(s.path_of(key),
                      fmt::format("expected an integer in [1, {}] (one MoE layer every N) or a "
                                  "list of {} entries 0 (dense) / 1 (MoE), one per layer; {}",
                                  num_layers, num_layers, what));
  };
  if (!v->is_array()) fail("found " + config::show_value(*v));
  if (static_cast<int64_t>(v->size()) != num_layers)
    fail(fmt::format("found a list of {} entries", v->size()));
  m.moe_layer_freq = 0;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    if (!e.is_number_integer() || (e.get<int64_t>() != 0 && e.get<int64_t>() != 1))
      fail(fmt::format("entry {} is {}", i, config::show_value(e)));
    m.moe_layers[i] = e.get<int64_t>() == 1;
  }
}

}  // namespace

const std::vector<std::string>& MoEConfig::keys() {
  static const std::vector<std::string> k = {"num_experts",
                                             "moe_router_topk",
                                             "moe_ffn_hidden_size",
                                             "moe_shared_expert_intermediate_size",
                                             "moe_aux_loss_coeff",
                                             "moe_z_loss_coeff",
                                             "moe_router_enable_expert_bias",
                                             "moe_router_bias_update_rate",
                                             "moe_expert_capacity_factor",
                                             "moe_layer_freq",
                                             "moe_router_score_function",
                                             "moe_router_load_balancing_type",
                                             "moe_router_topk_scaling_factor",
                                             "moe_router_num_groups",
                                             "moe_router_group_topk",
                                             "moe_latent_size"};
  return k;
}

int64_t MoEConfig::num_moe_layers() const {
  int64_t n = 0;
  for (bool b : moe_layers) n += b ? 1 : 0;
  return enabled() ? n : 0;
}

void read_moe_keys(config::Section& s, int64_t num_layers, MoEConfig& m) {
  if (!given(s, "num_experts")) {
    // A dense model: a moe key would silently do nothing.
    for (const auto& key : MoEConfig::keys())
      if (key != "num_experts" && given(s, key))
        throw ConfigError(s.path_of(key),
                          "an MoE setting in a dense model: give num_experts (the routed "
                          "experts of each MoE layer) or drop the key");
    return;
  }
  m.num_experts = s.get_int("num_experts", 0, 1, kMaxExperts);
  m.moe_router_topk = s.get_int("moe_router_topk", m.moe_router_topk, 1, kMaxExperts);
  if (given(s, "moe_ffn_hidden_size"))
    m.moe_ffn_hidden_size = s.get_int("moe_ffn_hidden_size", 0, 1, kMaxExpertFfn);
  if (given(s, "moe_shared_expert_intermediate_size"))
    m.moe_shared_expert_intermediate_size =
        s.get_int("moe_shared_expert_intermediate_size", 0, 1, kMaxExpertFfn);
  m.moe_aux_loss_coeff = s.get_double("moe_aux_loss_coeff", m.moe_aux_loss_coeff, 0.0);
  if (given(s, "moe_z_loss_coeff")) m.moe_z_loss_coeff = s.get_double("moe_z_loss_coeff", 0.0, 0.0);
  m.moe_router_enable_expert_bias =
      s.get_bool("moe_router_enable_expert_bias", m.moe_router_enable_expert_bias);
  m.moe_router_bias_update_rate =
      s.get_double("moe_router_bias_update_rate", m.moe_router_bias_update_rate, 0.0);
  if (given(s, "moe_expert_capacity_factor")) {
    m.moe_expert_capacity_factor = s.get_double("moe_expert_capacity_factor", 0.0, 0.0);
    if (!(m.moe_expert_capacity_factor > 0.0))
      throw ConfigError(s.path_of("moe_expert_capacity_factor"),
                        "expected a number > 0 (leave the key out, or null, for dropless "
                        "routing), found 0");
  }
  read_layer_freq(s, num_layers, m);
  m.moe_router_score_function = s.get_choice("moe_router_score_function",
                                             m.moe_router_score_function, {"softmax", "sigmoid"});
  m.moe_router_load_balancing_type =
      s.get_choice("moe_router_load_balancing_type", m.moe_router_load_balancing_type,
                   {"aux_loss", "seq_aux_loss", "none"});
  if (given(s, "moe_router_topk_scaling_factor"))
    m.moe_router_topk_scaling_factor = s.get_double("moe_router_topk_scaling_factor", 1.0, 0.0);
  if (given(s, "moe_router_num_groups"))
    m.moe_router_num_groups = s.get_int("moe_router_num_groups", 0, 1, kMaxExperts);
  if (given(s, "moe_router_group_topk"))
    m.moe_router_group_topk = s.get_int("moe_router_group_topk", 0, 1, kMaxExperts);
  if (given(s, "moe_latent_size"))
    m.moe_latent_size = s.get_int("moe_latent_size", 0, 1, kMaxLatentWidth);
}

void MoEConfig::validate(int64_t num_layers) const {
  if (!enabled()) return;
  auto fail = [](const char* key, const std::string& what) { throw ConfigError(key, what); };
  if (moe_router_topk < 1 || moe_router_topk > num_experts)
    fail("moe_router_topk", fmt::format("expected an integer in [1, num_experts = {}], found {}",
                                        num_experts, moe_router_topk));
  if (static_cast<int64_t>(moe_layers.size()) != num_layers)
    fail("moe_layer_freq",
         fmt::format("expected one entry per layer ({}), found {}", num_layers, moe_layers.size()));
  if (num_moe_layers() == 0)
    fail("moe_layer_freq",
         "selects no MoE layer: expected at least one 1 (or leave num_experts out for a dense "
         "model)");
  if (moe_router_score_function != "softmax" && moe_router_score_function != "sigmoid")
    fail("moe_router_score_function",
         fmt::format("expected \"softmax\" or \"sigmoid\", found \"{}\"",
                     moe_router_score_function));
  const std::string& lb = moe_router_load_balancing_type;
  if (lb != "aux_loss" && lb != "seq_aux_loss" && lb != "none")
    fail("moe_router_load_balancing_type",
         fmt::format("expected \"aux_loss\", \"seq_aux_loss\" or \"none\" (sinkhorn is not "
                     "implemented), found \"{}\"",
                     lb));
  if (lb == "none" && moe_aux_loss_coeff > 0.0)
    fail("moe_aux_loss_coeff",
         fmt::format("{} with moe_router_load_balancing_type \"none\": expected 0 (no "
                     "load-balancing loss), or choose \"aux_loss\" / \"seq_aux_loss\"",
                     moe_aux_loss_coeff));
  // Megatron's check (TransformerConfig): the bias balances sigmoid scores only.
  if (moe_router_enable_expert_bias && moe_router_score_function != "sigmoid")
    fail("moe_router_enable_expert_bias",
         "expert bias balancing needs moe_router_score_function \"sigmoid\" (Megatron's rule), "
         "found \"softmax\"");
  if ((moe_router_num_groups > 0) != (moe_router_group_topk > 0))
    fail(moe_router_num_groups > 0 ? "moe_router_group_topk" : "moe_router_num_groups",
         "group-limited routing needs both moe_router_num_groups and moe_router_group_topk");
  if (moe_router_num_groups > 0) {
    if (num_experts % moe_router_num_groups != 0)
      fail("moe_router_num_groups", fmt::format("expected a divisor of num_experts ({}), found {}",
                                                num_experts, moe_router_num_groups));
    if (moe_router_group_topk > moe_router_num_groups)
      fail("moe_router_group_topk", fmt::format("expected at most moe_router_num_groups ({}), "
                                                "found {}",
                                                moe_router_num_groups, moe_router_group_topk));
    const int64_t reachable = moe_router_group_topk * (num_experts / moe_router_num_groups);
    if (moe_router_topk < moe_router_group_topk || moe_router_topk > reachable)
      fail("moe_router_topk",
           fmt::format("group-limited routing: expected between moe_router_group_topk ({}) and "
                       "the experts of those groups ({}), found {}",
                       moe_router_group_topk, reachable, moe_router_topk));
  }
  if (moe_expert_capacity_factor < 0.0)
    fail("moe_expert_capacity_factor",
         fmt::format("expected a number > 0, found {}", moe_expert_capacity_factor));
}

void MoEConfig::to_json(json& j) const {
  if (!enabled()) return;
  j["num_experts"] = num_experts;
  j["moe_router_topk"] = moe_router_topk;
  if (moe_ffn_hidden_size > 0) j["moe_ffn_hidden_size"] = moe_ffn_hidden_size;
  if (moe_shared_expert_intermediate_size > 0)
    j["moe_shared_expert_intermediate_size"] = moe_shared_expert_intermediate_size;
  j["moe_aux_loss_coeff"] = moe_aux_loss_coeff;
  if (moe_z_loss_coeff > 0.0) j["moe_z_loss_coeff"] = moe_z_loss_coeff;
  j["moe_router_enable_expert_bias"] = moe_router_enable_expert_bias;
  j["moe_router_bias_update_rate"] = moe_router_bias_update_rate;
  if (moe_expert_capacity_factor > 0.0)
    j["moe_expert_capacity_factor"] = moe_expert_capacity_factor;
  if (moe_layer_freq > 0) {
    j["moe_layer_freq"] = moe_layer_freq;
  } else {
    json list = json::array();
    for (bool b : moe_layers) list.push_back(b ? 1 : 0);
    j["moe_layer_freq"] = list;
  }
  j["moe_router_score_function"] = moe_router_score_function;
  j["moe_router_load_balancing_type"] = moe_router_load_balancing_type;
  j["moe_router_topk_scaling_factor"] = moe_router_topk_scaling_factor;
  if (moe_router_num_groups > 0) j["moe_router_num_groups"] = moe_router_num_groups;
  if (moe_router_group_topk > 0) j["moe_router_group_topk"] = moe_router_group_topk;
  if (moe_latent_size > 0) j["moe_latent_size"] = moe_latent_size;
}

}  // namespace dscpp::model_zoo
