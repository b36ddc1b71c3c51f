// The MoE keys of a model config under Megatron-LM's names: their defaults, moe_layer_freq's
// two forms, the shipped MoE configs' parameter counts (hand-counted below), and a ConfigError
// naming the key for every bad or inconsistent value.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dscpp/model_zoo/gpt_config.h"
#include "tests/model_zoo/config_test_util.h"

namespace mz = dscpp::model_zoo;
using model_config_test::error_of;
using model_config_test::has;
using model_config_test::shipped;
using nlohmann::json;

namespace {

// A small SwiGLU model with experts: the keys each test changes go on top.
json base() {
  return {{"hidden_size", 64},      {"num_layers", 4},          {"num_attention_heads", 4},
          {"seq_length", 32},       {"vocab_size", 1000},       {"swiglu", true},
          {"ffn_hidden_size", 128}, {"add_bias_linear", false}, {"normalization", "RMSNorm"},
          {"num_experts", 8}};
}

std::string error_with(const json& changes) {
  json j = base();
  for (const auto& item : changes.items()) {
    if (item.value().is_null() && item.key() != "moe_expert_capacity_factor")
      j.erase(item.key());
    else
      j[item.key()] = item.value();
  }
  return error_of([&] { mz::GPTConfig::from_json(j); });
}

}  // namespace

TEST(MoEConfigs, NumExpertsAloneTakesMegatronsDefaults) {
  const mz::GPTConfig c = mz::GPTConfig::from_json(base());
  const mz::MoEConfig& m = c.moe;
  EXPECT_TRUE(m.enabled());
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(c.moe_ffn_size(), 128);  // ffn_hidden_size
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 0);
  EXPECT_EQ(m.moe_expert_capacity_factor, 0.0);  // dropless
  EXPECT_EQ(m.moe_layers, std::vector<bool>(4, true));
  EXPECT_EQ(m.moe_router_score_function, "softmax");
  EXPECT_EQ(m.moe_router_load_balancing_type, "aux_loss");
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.0);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.0);
  EXPECT_FALSE(m.moe_router_enable_expert_bias);
  EXPECT_EQ(m.moe_router_bias_update_rate, 1e-3);
  EXPECT_EQ(c.parallelism.expert_model_parallel_size, 1);
  EXPECT_EQ(c.first_non_gpt2_block_key(), "normalization");
  // A dense config has no MoE: its counts are unchanged and it writes no moe key.
  json dense = base();
  dense.erase("num_experts");
  const mz::GPTConfig d = mz::GPTConfig::from_json(dense);
  EXPECT_FALSE(d.moe.enabled());
  EXPECT_EQ(d.active_parameters(), d.num_parameters());
  EXPECT_FALSE(d.to_json().contains("num_experts"));
  // null is Megatron's None.
  dense["num_experts"] = nullptr;
  EXPECT_FALSE(mz::GPTConfig::from_json(dense).moe.enabled());
}

TEST(MoEConfigs, MoeLayerFreqIsEveryNthLayerOrAList) {
  json j = base();
  j["num_layers"] = 6;
  j["moe_layer_freq"] = 2;  // Megatron: layer i is MoE when i % 2 == 0
  EXPECT_EQ(mz::GPTConfig::from_json(j).moe.moe_layers,
            (std::vector<bool>{true, false, true, false, true, false}));
  j["moe_layer_freq"] = json::array({0, 1, 1, 0, 1, 1});  // a first dense layer, ...
  const mz::GPTConfig c = mz::GPTConfig::from_json(j);
  EXPECT_EQ(c.moe.moe_layers, (std::vector<bool>{false, true, true, false, true, true}));
  EXPECT_EQ(c.moe.num_moe_layers(), 4);
  // Both forms write back and read the same.
  EXPECT_EQ(mz::GPTConfig::from_json(c.to_json()).moe.moe_layers, c.moe.moe_layers);
  EXPECT_EQ(mz::GPTConfig::from_json(c.to_json()).to_json(), c.to_json());
}

TEST(MoEConfigs, ShippedTinyConfigCountsItsParametersByHand) {
  const mz::GPTConfig c = mz::GPTConfig::from_file(shipped("moe_tiny.yaml"));
  EXPECT_EQ(c.moe.moe_layers, (std::vector<bool>{true, false, true, false}));
  // h 64, 4 heads of 16, 2 k/v groups, RMSNorm, SwiGLU, tied embedding of 50304.
  const int64_t h = 64, attention = 2 * h + h * (h + 2 * 2 * 16) + h * h;
  const int64_t dense_mlp = 3 * h * 128;
  // Router 8 x 64, 8 experts of SwiGLU FFN 64 (3 h f each), a shared expert of FFN 64.
  const int64_t moe_all = 8 * h + 8 * 3 * h * 64 + 3 * h * 64;
  const int64_t moe_active = 8 * h + 2 * 3 * h * 64 + 3 * h * 64;
  const int64_t rest = 50304 * h + h;  // embedding, final norm
  EXPECT_EQ(c.num_parameters(), 4 * attention + 2 * dense_mlp + 2 * moe_all + rest);
  EXPECT_EQ(c.num_parameters(), 3540544);
  EXPECT_EQ(c.active_parameters(), 4 * attention + 2 * dense_mlp + 2 * moe_active + rest);
  // MFU counts the active parameters.
  EXPECT_DOUBLE_EQ(c.flops_per_token(),
                   6.0 * static_cast<double>(c.active_parameters()) + 12.0 * 4 * 64 * 64);
}

TEST(MoEConfigs, Marin535BCountsAbout535BTotalAnd24BActive) {
  const mz::GPTConfig c = mz::GPTConfig::from_file(shipped("marin_535B_A23B.yaml"));
  EXPECT_EQ(c.parallelism.expert_model_parallel_size, 64);
  EXPECT_EQ(c.moe.moe_latent_size, 3072);
  EXPECT_DOUBLE_EQ(c.moe.moe_expert_capacity_factor, 1.15);
  const int64_t h = 6144, layers = 48, vocab = 128256;
  const int64_t attention = 2 * h + h * (h + 2 * 8 * 128) + h * h;
  // Router, experts in the latent width (3 x 3072 x 3072 each), shared FFN 6144 on h,
  // the latent down and up projections.
  auto moe = [&](int64_t experts) {
    return 384 * h + experts * 3 * 3072 * 3072 + 3 * h * 6144 + 2 * h * 3072;
  };
  const int64_t rest = 2 * vocab * h + h;
  EXPECT_EQ(c.num_parameters(), layers * (attention + moe(384)) + rest);
  EXPECT_EQ(c.active_parameters(), layers * (attention + moe(8)) + rest);
  EXPECT_EQ(c.num_parameters(), int64_t{535003994112});
  EXPECT_EQ(c.active_parameters(), int64_t{24037103616});
}

TEST(MoEConfigs, BadOrInconsistentValuesNameTheirKey) {
  struct Case {
    json changes;
    std::string key, words;
  };
  const std::vector<Case> cases = {
      {{{"num_experts", nullptr}, {"moe_router_topk", 2}}, "moe_router_topk", "dense model"},
      {{{"num_experts", 0}}, "num_experts", "in [1, 65536]"},
      {{{"moe_router_topk", 9}}, "moe_router_topk", "num_experts = 8"},
      {{{"moe_layer_freq", json::array({1, 0})}}, "moe_layer_freq", "list of 2 entries"},
      {{{"moe_layer_freq", json::array({1, 0, 2, 0})}}, "moe_layer_freq", "entry 2"},
      {{{"moe_layer_freq", json::array({0, 0, 0, 0})}}, "moe_layer_freq", "no MoE layer"},
      {{{"moe_layer_freq", 5}}, "moe_layer_freq", "[1, 4]"},
      {{{"moe_router_score_function", "relu"}}, "moe_router_score_function", "sigmoid"},
      {{{"moe_router_load_balancing_type", "sinkhorn"}},
       "moe_router_load_balancing_type",
       "aux_loss"},
      {{{"moe_router_load_balancing_type", "none"}, {"moe_aux_loss_coeff", 0.01}},
       "moe_aux_loss_coeff",
       "\"none\""},
      {{{"moe_router_enable_expert_bias", true}}, "moe_router_enable_expert_bias", "sigmoid"},
      {{{"moe_expert_capacity_factor", 0}}, "moe_expert_capacity_factor", "dropless"},
      {{{"moe_aux_loss_coeff", -1}}, "moe_aux_loss_coeff", ">= 0"},
      {{{"moe_router_num_groups", 4}}, "moe_router_group_topk", "both"},
      {{{"moe_router_num_groups", 3}, {"moe_router_group_topk", 1}},
       "moe_router_num_groups",
       "divisor of num_experts"},
      {{{"moe_router_top_k", 2}}, "moe_router_top_k", "did you mean 'moe_router_topk'"},
      {{{"parallelism", {{"expert_model_parallel_size", 3}}}},
       "parallelism.expert_model_parallel_size",
       "divisor of num_experts (8)"},
      {{{"num_experts", nullptr}, {"parallelism", {{"expert_model_parallel_size", 2}}}},
       "parallelism.expert_model_parallel_size",
       "dense model"},
  };
  for (const auto& c : cases) {
    const std::string e = error_with(c.changes);
    EXPECT_TRUE(has(e, c.key + ":") && has(e, c.words)) << c.changes.dump() << " gave: " << e;
  }
  // The expert degree splits the data axis: checked against the job.
  json j = base();
  j["parallelism"] = {{"expert_model_parallel_size", 4}};
  const mz::GPTConfig c = mz::GPTConfig::from_json(j);
  EXPECT_EQ(c.parallelism.resolve(8).expert_model_parallel_size, 4);
  const std::string e = error_of([&] { c.parallelism.resolve(6); });
  EXPECT_TRUE(has(e, "parallelism.expert_model_parallel_size") && has(e, "data degree (6)")) << e;
}
