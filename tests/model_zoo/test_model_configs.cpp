// Model configs as the seed writes them: YAML with `model:` and `parallelism:` sections,
// Megatron-LM's defaults for what is left out, the shipped 1.3B_demo and 535B layouts, unknown
// sections refused, and JSON (flat or sectioned) read the same way.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/model_zoo/gpt_config.h"
#include "tests/model_zoo/config_test_util.h"

namespace mz = dscpp::model_zoo;
using model_config_test::error_of;
using model_config_test::has;
using model_config_test::shipped;
using nlohmann::json;

namespace {

std::string write(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

const char* kSectioned =
    "model:\n"
    "  hidden_size: 64\n"
    "  num_layers: 2\n"
    "  num_attention_heads: 4\n"
    "  seq_length: 32\n"
    "parallelism:\n"
    "  tensor_model_parallel_size: 1\n"
    "  pipeline_model_parallel_size: 1\n"
    "  data_parallel_size: 2\n";

}  // namespace

TEST(ModelConfigs, SectionedYamlWithTheFourKeysTakesMegatronsDefaults) {
  mz::GPTConfig c = mz::GPTConfig::from_file(write("four.yaml", kSectioned));
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.seq_length, 32);
  EXPECT_EQ(c.ffn_size(), 256);    // 4h
  EXPECT_EQ(c.positions(), 32);    // = seq_length
  EXPECT_EQ(c.vocab_size, 50304);  // 50257 rounded up to a multiple of 128: 393 * 128
  EXPECT_EQ(c.parallelism.data_parallel_size, 2);
  EXPECT_EQ(c.parallelism.resolve(2).data_parallel_size, 2);
  // The padding's multiple is a key of its own; an explicit vocab_size is taken as written.
  EXPECT_EQ(mz::GPTConfig::padded_vocab_size(50257, 256), 50432);
  json j = c.to_json();
  j.erase("vocab_size");
  j["make_vocab_size_divisible_by"] = 64;
  EXPECT_EQ(mz::GPTConfig::from_json(j).vocab_size, 50304);  // 786 * 64 = 50304 as well
  j["make_vocab_size_divisible_by"] = 1;
  EXPECT_EQ(mz::GPTConfig::from_json(j).vocab_size, 50257);
  j["vocab_size"] = 1000;
  EXPECT_EQ(mz::GPTConfig::from_json(j).vocab_size, 1000);
}

TEST(ModelConfigs, JsonAndYamlFlatOrSectionedReadAlike) {
  const mz::GPTConfig yaml = mz::GPTConfig::from_file(write("s.yaml", kSectioned));
  json sectioned = {
      {"model",
       {{"hidden_size", 64}, {"num_layers", 2}, {"num_attention_heads", 4}, {"seq_length", 32}}},
      {"parallelism",
       {{"tensor_model_parallel_size", 1},
        {"pipeline_model_parallel_size", 1},
        {"data_parallel_size", 2}}}};
  EXPECT_EQ(mz::GPTConfig::from_file(write("s.json", sectioned.dump())).to_json(), yaml.to_json());
  json flat = sectioned["model"];
  flat["parallelism"] = sectioned["parallelism"];
  EXPECT_EQ(mz::GPTConfig::from_file(write("f.json", flat.dump())).to_json(), yaml.to_json());
  EXPECT_EQ(mz::GPTConfig::from_file(write("f.yml",
                                           "hidden_size: 64\nnum_layers: 2\n"
                                           "num_attention_heads: 4\nseq_length: 32\n"
                                           "parallelism: {data_parallel_size: 2}\n"))
                .to_json(),
            yaml.to_json());
  // The shipped JSON configs are unchanged.
  EXPECT_EQ(mz::GPTConfig::from_file(shipped("gpt_1.3B.json")).seq_length, 1024);
}

TEST(ModelConfigs, UnknownSectionsAreNamedWithTheKnownOnes) {
  std::string e = error_of([] {
    mz::GPTConfig::from_file(write("u.yaml", std::string(kSectioned) + "training:\n  lr: 0.1\n"));
  });
  EXPECT_TRUE(has(e,
                  "training: unknown section of a model config (known sections: model, "
                  "parallelism)"))
      << e;
  EXPECT_TRUE(has(e, "u.yaml:10:1")) << e;
  // A file of sections without `model` is told about sections, not about hidden_size.
  e = error_of([] { mz::GPTConfig::from_file(write("m.yaml", "modle:\n  hidden_size: 64\n")); });
  EXPECT_TRUE(has(e, "modle: unknown section")) << e;
  EXPECT_FALSE(has(e, "hidden_size")) << e;
  e = error_of([] {
    mz::GPTConfig::from_file(write("k.yaml", std::string(kSectioned) + "hidden_size: 64\n"));
  });
  EXPECT_TRUE(has(e, "hidden_size: a sectioned model config holds its keys in sections")) << e;
  e = error_of([] { mz::GPTConfig::from_file(write("n.yaml", "model: 3\n")); });
  EXPECT_TRUE(has(e, "model: expected an object")) << e;
}

TEST(ModelConfigs, ErrorsInsideSectionsNameThePathAndTheLine) {
  std::string text = kSectioned;
  text.replace(text.find("num_layers: 2"), 13, "num_layers: two");
  std::string e = error_of([&] { mz::GPTConfig::from_file(write("e.yaml", text)); });
  EXPECT_TRUE(has(e, "model.num_layers") && has(e, "expected an integer")) << e;
  EXPECT_TRUE(has(e, "e.yaml:3:3")) << e;
  e = error_of([] { mz::GPTConfig::from_file(write("h.yaml", "model:\n  num_layers: 2\n")); });
  EXPECT_TRUE(has(e, "model.hidden_size: required key missing")) << e;
  e = error_of([] {
    mz::GPTConfig::from_file(write("p.yaml", std::string(kSectioned) + "  tensor_paralel: 2\n"));
  });
  EXPECT_TRUE(has(e, "parallelism.tensor_paralel") && has(e, "p.yaml:10:3")) << e;
  // Dimensions and degrees beyond any real model are refused before any count overflows
  // (found by fuzz_model_config).
  e = error_of([] {
    mz::GPTConfig::from_json(
        json::parse(R"({"model": {"hidden_size": 4611686018427387904, "num_layers": 2,
                        "num_attention_heads": 4, "seq_length": 8}})"));
  });
  EXPECT_TRUE(has(e, "model.hidden_size")) << e;
  e = error_of([] {
    mz::GPTConfig::from_json(json::parse(
        R"({"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "seq_length": 8,
            "parallelism": {"tensor_model_parallel_size": 4611686018427387904}})"));
  });
  EXPECT_TRUE(has(e, "parallelism.tensor_model_parallel_size")) << e;
  // The world-size arithmetic of the parallelism section.
  mz::GPTConfig c = mz::GPTConfig::from_file(write("w.yaml", kSectioned));
  e = error_of([&] { c.parallelism.resolve(4); });
  EXPECT_TRUE(has(e, "data_parallel_size 2 = 2, but the job has 4 ranks")) << e;
}

TEST(ModelConfigs, TheSeedsShippedYamlConfigsHaveTheirShapes) {
  mz::GPTConfig demo = mz::GPTConfig::from_file(shipped("1.3B_demo.yaml"));
  EXPECT_EQ(demo.hidden_size, 2048);
  EXPECT_EQ(demo.num_layers, 24);
  EXPECT_EQ(demo.num_attention_heads, 16);
  EXPECT_EQ(demo.seq_length, 2048);
  EXPECT_EQ(demo.ffn_size(), 8192);
  EXPECT_EQ(demo.vocab_size, 50304);
  EXPECT_EQ(demo.parallelism.resolve(8).tensor_model_parallel_size, 2);
  EXPECT_EQ(demo.parallelism.resolve(8).pipeline_model_parallel_size, 2);
  EXPECT_EQ(demo.parallelism.resolve(8).data_parallel_size, 2);
  // 12 L h^2 + 13 L h + (V + s) h + 2h, by hand: 24 * (12 * 2048^2 + 13 * 2048)
  // + (50304 + 2048) * 2048 + 2 * 2048.
  EXPECT_EQ(demo.num_parameters(), 1'315'819'520);

  mz::GPTConfig big = mz::GPTConfig::from_file(shipped("535B_model.yaml"));
  EXPECT_EQ(big.hidden_size, 20480);
  EXPECT_EQ(big.num_layers, 120);
  EXPECT_EQ(big.num_attention_heads, 128);
  EXPECT_EQ(big.seq_length, 2048);
  EXPECT_EQ(big.parallelism.resolve(8192).data_parallel_size, 64);
  // 120 * (12 * 20480^2 + 13 * 20480) + (50304 + 2048) * 20480 + 2 * 20480: 605 B. The
  // seed's name says 535B, but 12 L h^2 alone is 604 B for this shape; we count what it holds.
  EXPECT_EQ(big.num_parameters(), 605'083'934'720);
}

// The current models' blocks under Megatron's names: GPT-2's blocks when absent, Megatron's
// swiglu FFN rule, both spellings of the untied head, and the refusals by name.
TEST(ModelConfigs, CurrentModelBlockKeysDefaultToGPT2AndReadAsMegatronNamesThem) {
  const json base = {
      {"hidden_size", 96}, {"num_layers", 2}, {"num_attention_heads", 4}, {"seq_length", 16}};
  mz::GPTConfig gpt2 = mz::GPTConfig::from_json(base);
  EXPECT_EQ(gpt2.normalization, "LayerNorm");
  EXPECT_EQ(gpt2.position_embedding_type, "learned_absolute");
  EXPECT_EQ(gpt2.rotary_base, 10000.0);
  EXPECT_EQ(gpt2.rotary_percent, 1.0);
  EXPECT_FALSE(gpt2.swiglu);
  EXPECT_EQ(gpt2.query_groups(), 4);
  EXPECT_TRUE(gpt2.add_bias_linear);
  EXPECT_TRUE(gpt2.tie_word_embeddings);
  EXPECT_EQ(gpt2.first_non_gpt2_block_key(), "");
  EXPECT_EQ(gpt2.ffn_size(), 384);

  json sw = base;
  sw["swiglu"] = true;
  EXPECT_EQ(mz::GPTConfig::from_json(sw).ffn_size(), 256);  // int(4 * 96 * 2/3 / 64) * 64
  sw["hidden_size"] = 4096;
  sw["num_attention_heads"] = 32;
  EXPECT_EQ(mz::GPTConfig::from_json(sw).ffn_size(), 10880);  // int(10922.67 / 64) * 64
  sw["ffn_hidden_size"] = 11008;                              // Llama-2 7B's, as given
  EXPECT_EQ(mz::GPTConfig::from_json(sw).ffn_size(), 11008);
  // Round trip keeps every block key.
  mz::GPTConfig llama = mz::GPTConfig::from_file(shipped("llama_tiny.json"));
  EXPECT_EQ(llama.normalization, "RMSNorm");
  EXPECT_FALSE(llama.residual_layernorm_fusion);  // the default with RMSNorm: no fused kernel
  EXPECT_EQ(llama.position_embedding_type, "rope");
  EXPECT_TRUE(llama.swiglu);
  EXPECT_EQ(llama.ffn_size(), 320);  // int(512 * 2/3 / 64) * 64
  EXPECT_EQ(llama.query_groups(), 2);
  EXPECT_FALSE(llama.add_bias_linear);
  EXPECT_FALSE(llama.tie_word_embeddings);
  EXPECT_EQ(llama.rotary_dim(), 32);
  // Per block: RMSNorms 2 x 128, qkv (128 + 2 x 2 x 32) x 128, proj 128 x 128, fc 640 x 128,
  // mlp.proj 128 x 320, no biases; no position table; the untied head 50304 x 128.
  EXPECT_EQ(llama.num_parameters(), 2 * 50304 * 128 + 4 * 172288 + 128);  // 13.57 M
  EXPECT_NEAR(llama.flops_per_token() / 1e9, 0.0822, 1e-4);
  EXPECT_EQ(llama.first_non_gpt2_block_key(), "normalization");
  EXPECT_EQ(mz::GPTConfig::from_json(llama.to_json()).to_json(), llama.to_json());

  json untie = base;
  untie["untie_embeddings_and_output_weights"] = true;
  EXPECT_FALSE(mz::GPTConfig::from_json(untie).tie_word_embeddings);
  untie["tie_word_embeddings"] = false;
  EXPECT_TRUE(has(error_of([&] { mz::GPTConfig::from_json(untie); }), "give only one of them"));

  auto error_with = [&](const json& extra) {
    json j = base;
    j.update(extra);
    return error_of([&] { mz::GPTConfig::from_json(j); });
  };
  json lower = base;  // choices read case-insensitively, as the config reader does for all
  lower["normalization"] = "rmsnorm";
  EXPECT_EQ(mz::GPTConfig::from_json(lower).normalization, "RMSNorm");
  EXPECT_TRUE(has(error_with({{"normalization", "ScaleNorm"}}),
                  "normalization: expected one of \"LayerNorm\", \"RMSNorm\""));
  EXPECT_TRUE(has(error_with({{"position_embedding_type", "alibi"}}), "position_embedding_type"));
  EXPECT_TRUE(has(error_with({{"num_query_groups", 3}}), "num_query_groups: expected a divisor"));
  EXPECT_TRUE(has(error_with({{"num_query_groups", 8}}), "num_query_groups"));
  // head_dim 24 * 0.3 = 7.2 -> 7 channels: rope rotates pairs.
  EXPECT_TRUE(has(error_with({{"position_embedding_type", "rope"}, {"rotary_percent", 0.3}}),
                  "rotary_percent: expected int(head_dim 24 * rotary_percent) to be even"));
  EXPECT_TRUE(has(error_with({{"swiglu", true}, {"hidden_size", 16}}), "ffn_hidden_size"));
  EXPECT_TRUE(has(error_with({{"normalization", "RMSNorm"}, {"residual_layernorm_fusion", true}}),
                  "residual_layernorm_fusion: expected false with normalization"));
}

TEST(ModelConfigs, Fp8KeysReadAsMegatronNamesThemAndKeepTheFirstAndLastBlocksInBf16) {
  const json base = {
      {"hidden_size", 64}, {"num_layers", 4}, {"num_attention_heads", 4}, {"seq_length", 16}};
  // Off unless asked.
  EXPECT_FALSE(mz::GPTConfig::from_json(base).fp8_recipe_of(1).has_value());
  json j = base;
  j["fp8"] = "hybrid";
  const mz::GPTConfig c = mz::GPTConfig::from_json(j);
  // Blocks 0 and 3 stay bf16 by default; 1 and 2 multiply in fp8, tensorwise, hybrid.
  EXPECT_FALSE(c.fp8_recipe_of(0).has_value());
  ASSERT_TRUE(c.fp8_recipe_of(1).has_value());
  EXPECT_TRUE(c.fp8_recipe_of(1)->hybrid);
  EXPECT_EQ(c.fp8_recipe_of(2)->scaling, dscpp::nn::Fp8Scaling::Tensorwise);
  EXPECT_FALSE(c.fp8_recipe_of(3).has_value());
  EXPECT_EQ(mz::GPTConfig::from_json(c.to_json()).to_json(), c.to_json());
  // Every block, rowwise, e4m3, with a margin.
  j.update({{"first_last_layers_bf16", false},
            {"fp8", "e4m3"},
            {"fp8_recipe", "rowwise"},
            {"fp8_margin", 2}});
  const mz::GPTConfig all = mz::GPTConfig::from_json(j);
  ASSERT_TRUE(all.fp8_recipe_of(0).has_value());
  EXPECT_FALSE(all.fp8_recipe_of(3)->hybrid);
  EXPECT_EQ(all.fp8_recipe_of(3)->scaling, dscpp::nn::Fp8Scaling::Rowwise);
  EXPECT_EQ(all.fp8_recipe_of(3)->margin, 2);
  // Delayed, with Megatron's defaults (a history of 1, the most recent amax), then others.
  j.update({{"fp8", "hybrid"}, {"fp8_recipe", "delayed"}});
  const mz::GPTConfig delayed = mz::GPTConfig::from_json(j);
  EXPECT_EQ(delayed.fp8_recipe_of(2)->scaling, dscpp::nn::Fp8Scaling::Delayed);
  EXPECT_EQ(delayed.fp8_recipe_of(2)->amax_history_len, 1);
  EXPECT_EQ(delayed.fp8_recipe_of(2)->amax_compute_algo, dscpp::nn::Fp8AmaxAlgo::MostRecent);
  j.update({{"fp8_amax_history_len", 16}, {"fp8_amax_compute_algo", "max"}});
  const mz::GPTConfig history = mz::GPTConfig::from_json(j);
  EXPECT_EQ(history.fp8_recipe_of(2)->amax_history_len, 16);
  EXPECT_EQ(history.fp8_recipe_of(2)->amax_compute_algo, dscpp::nn::Fp8AmaxAlgo::Max);
  EXPECT_EQ(mz::GPTConfig::from_json(history.to_json()).to_json(), history.to_json());
  // Wrong values are named with what is accepted.
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"fp8", "e5m2"}, {"fp8_amax_history_len", 0}, {"fp8_amax_compute_algo", "mean"}}) {
    json bad = j;
    bad[key] = value;
    const std::string e = error_of([&] { mz::GPTConfig::from_json(bad); });
    EXPECT_TRUE(has(e, key)) << key << ": " << e;
  }
  // Megatron's fp8_param_gather: false is what dscpp does; true is refused by its name.
  json gather = j;
  gather["fp8_param_gather"] = false;
  EXPECT_EQ(mz::GPTConfig::from_json(gather).to_json(), history.to_json());
  gather["fp8_param_gather"] = true;
  const std::string e = error_of([&] { mz::GPTConfig::from_json(gather); });
  EXPECT_TRUE(has(e, "fp8_param_gather") && has(e, "not implemented")) << e;
}
