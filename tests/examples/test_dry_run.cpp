// train_gpt --dry-run's figures against values computed by hand (the comments show the
// arithmetic): the seed's 1.3B_demo at 2 x 2 x 2, a tiny data-parallel config, the 535B layout's
// groups, and the layout errors.
#include <gtest/gtest.h>

#include "dry_run.h"
#include "dscpp/config/config_error.h"

namespace ex = dscpp::examples;
namespace mz = dscpp::model_zoo;

namespace {

std::string shipped(const std::string& name) {
  return std::string(DSCPP_MODEL_ZOO_CONFIGS) + "/" + name;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(DryRun, SeedsDemoAtTwoByTwoByTwo) {
  const mz::GPTConfig c = mz::GPTConfig::from_file(shipped("1.3B_demo.yaml"));
  const ex::DryRunPlan r = ex::plan_dry_run(c, ex::resolve_layout(c, 8), 1, 2);
  // N = 24 (12 h^2 + 13 h) + (50304 + 2048) h + 2h at h = 2048.
  EXPECT_EQ(r.parameters, 1'315'819'520);
  // Psi = N / (t p) = N / 4.
  EXPECT_DOUBLE_EQ(r.parameters_per_gpu, 328'954'880.0);
  // d = 2: 16 Psi; 4 Psi + 6 Psi; 2 Psi + 7 Psi; 8 Psi.
  EXPECT_DOUBLE_EQ(r.model_states_bytes[0], 5'263'278'080.0);
  EXPECT_DOUBLE_EQ(r.model_states_bytes[1], 3'289'548'800.0);
  EXPECT_DOUBLE_EQ(r.model_states_bytes[2], 2'960'593'920.0);
  EXPECT_DOUBLE_EQ(r.model_states_bytes[3], 2'631'639'040.0);
  EXPECT_EQ(r.layers_per_stage, 12);
  // sbh = 2048 * 1 * 2048 = 2^22; 5as/h = 5 * 16 * 2048 / 2048 = 80; t = 2.
  const double sbh = 4'194'304.0;
  ASSERT_EQ(r.activations.size(), 7u);
  EXPECT_DOUBLE_EQ(r.activations[0].bytes_per_layer, sbh * 114);  // 34 + 80
  EXPECT_DOUBLE_EQ(r.activations[1].bytes_per_layer, sbh * 62);   // 10 + 12 + 40
  EXPECT_DOUBLE_EQ(r.activations[2].bytes_per_layer, sbh * 57);   // 114 / 2
  EXPECT_DOUBLE_EQ(r.activations[3].bytes_per_layer, sbh * 22);   // 10 + 12
  EXPECT_DOUBLE_EQ(r.activations[4].bytes_per_layer, sbh * 17);   // 34 / 2
  EXPECT_DOUBLE_EQ(r.activations[5].bytes_per_layer, sbh * 2);
  EXPECT_DOUBLE_EQ(r.activations[6].bytes_per_layer, sbh);  // 2 / 2
  for (size_t i = 0; i < r.activations.size(); ++i)
    EXPECT_EQ(r.activations[i].this_config, i == 1) << r.activations[i].strategy;
  // rank = 4 pipe + 2 data + model.
  using G = std::vector<std::vector<int>>;
  EXPECT_EQ(r.tensor_groups, (G{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(r.pipeline_groups, (G{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(r.data_groups, (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));

  const std::string text = ex::format_dry_run(r);
  EXPECT_TRUE(has(text, "parameters: 1,315,819,520 (1.32 B)")) << text;
  EXPECT_TRUE(has(text, "tensor 2 x pipeline 2 x data 2 = 8 ranks")) << text;
  EXPECT_TRUE(has(text, "2.76 GiB   <- the ds_config's stage")) << text;  // 9 Psi / 2^30
  EXPECT_TRUE(has(text, "tensor groups    4 of 2: [0, 1] [2, 3] [4, 5] [6, 7]")) << text;
  EXPECT_TRUE(has(text, "data groups      4 of 2: [0, 2] [1, 3] [4, 6] [5, 7]")) << text;
  // 62 sbh = 248.0 MiB a layer, 12 layers: 2.91 GiB.
  EXPECT_TRUE(has(text, "248.0 MiB       2.91 GiB   <- this config")) << text;
}

TEST(DryRun, TinyDataParallelConfigWithRecomputation) {
  mz::GPTConfig c = mz::GPTConfig::from_json(
      {{"hidden_size", 64}, {"num_layers", 2}, {"num_attention_heads", 4}, {"seq_length", 32}});
  ex::DryRunPlan r = ex::plan_dry_run(c, ex::resolve_layout(c, 2), 4);
  // 2 (12 * 64^2 + 13 * 64) + (50304 + 32) * 64 + 128.
  EXPECT_EQ(r.parameters, 3'321'600);
  EXPECT_EQ(r.layout.data_parallel_size, 2);  // what the world leaves
  EXPECT_DOUBLE_EQ(r.model_states_bytes[2], 9.0 * 3'321'600);
  EXPECT_DOUBLE_EQ(r.model_states_bytes[3], 8.0 * 3'321'600);
  // sbh = 32 * 4 * 64 = 8192; 5as/h = 5 * 4 * 32 / 64 = 10: 44 sbh a layer, both rows at t = 1.
  EXPECT_DOUBLE_EQ(r.activations[0].bytes_per_layer, 44.0 * 8192);
  EXPECT_DOUBLE_EQ(r.activations[1].bytes_per_layer, 44.0 * 8192);
  EXPECT_TRUE(r.activations[0].this_config);
  EXPECT_EQ(r.layers_per_stage, 2);
  c.checkpoint_activations = true;
  r = ex::plan_dry_run(c, ex::resolve_layout(c, 2), 4);
  EXPECT_TRUE(r.activations[5].this_config);
  EXPECT_DOUBLE_EQ(r.activations[5].bytes_per_layer, 2.0 * 8192);
  EXPECT_EQ(r.tensor_groups, (std::vector<std::vector<int>>{{0}, {1}}));
  EXPECT_EQ(r.data_groups, (std::vector<std::vector<int>>{{0, 1}}));
}

TEST(DryRun, TheSeeds535BLayoutWithoutBuildingIt) {
  const mz::GPTConfig c = mz::GPTConfig::from_file(shipped("535B_model.yaml"));
  const ex::DryRunPlan r = ex::plan_dry_run(c, ex::resolve_layout(c, 0), 1);
  EXPECT_EQ(r.layout.data_parallel_size, 64);
  EXPECT_EQ(r.tensor_groups.size(), 1024u);
  EXPECT_EQ(r.tensor_groups[1], (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  ASSERT_EQ(r.data_groups.size(), 128u);  // 8 x 16 of 64 ranks, stride t = 8
  EXPECT_EQ(r.data_groups[0][1], 8);
  EXPECT_EQ(r.data_groups[0][63], 504);
  ASSERT_EQ(r.pipeline_groups.size(), 512u);  // stride t d = 512
  EXPECT_EQ(r.pipeline_groups[0][15], 7680);
  // Psi = N / 128; ZeRO-3 over 64: 16 Psi / 64 = Psi / 4 bytes.
  EXPECT_DOUBLE_EQ(r.model_states_bytes[3], 605'083'934'720.0 / 128 / 4);
  EXPECT_EQ(r.layers_per_stage, 8);
  const std::string text = ex::format_dry_run(r);
  EXPECT_TRUE(has(text, "[0, 8, 16, ..., 496, 504]")) << text;
  EXPECT_TRUE(has(text, "1024 of 8: [0, 1, 2, 3, 4, 5, 6, 7]")) << text;
}

TEST(DryRun, LayoutErrorsShowTheArithmetic) {
  mz::GPTConfig c = mz::GPTConfig::from_file(shipped("1.3B_demo.yaml"));
  auto error = [&](int64_t world) {
    try {
      ex::resolve_layout(c, world);
    } catch (const dscpp::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_TRUE(has(error(4), "x data_parallel_size 2 = 8, but the job has 4 ranks")) << error(4);
  c.parallelism.tensor_model_parallel_size = 3;
  c.parallelism.data_parallel_size = 0;
  EXPECT_TRUE(has(error(12), "16 attention heads do not split across 3")) << error(12);
  c.parallelism.tensor_model_parallel_size = 1;
  c.parallelism.pipeline_model_parallel_size = 32;
  EXPECT_TRUE(has(error(32), "32 pipeline stages for 24 layers")) << error(32);
}

TEST(DryRun, Marin535BCountsTotalAndActiveAndSplitsTheExperts) {
  const mz::GPTConfig c = mz::GPTConfig::from_file(shipped("marin_535B_A23B.yaml"));
  const ex::DryRunPlan r = ex::plan_dry_run(c, ex::resolve_layout(c, 0), 1, 1);
  EXPECT_EQ(r.layout.expert_model_parallel_size, 64);
  EXPECT_EQ(r.layout.data_parallel_size, 64);
  EXPECT_EQ(r.parameters, 535'003'994'112);
  EXPECT_EQ(r.active_parameters, 24'037'103'616);
  // 48 layers x 384 experts x 3 x 3072 (latent) x 3072 (FFN).
  EXPECT_EQ(r.expert_parameters, 521'838'526'464);
  // Experts over t p ep = 8 x 64; the rest over t p = 8.
  const double psi_e = 521'838'526'464.0 / 512, psi_d = (535'003'994'112.0 - 521'838'526'464.0) / 8;
  EXPECT_DOUBLE_EQ(r.expert_parameters_per_gpu, psi_e);
  EXPECT_DOUBLE_EQ(r.parameters_per_gpu, psi_d + psi_e);
  // ZeRO-1: the dense states over d = 64, the experts' over d / ep = 1.
  EXPECT_DOUBLE_EQ(r.model_states_bytes[1], 4 * psi_d + 12 * psi_d / 64 + 16 * psi_e);
  const std::string text = ex::format_dry_run(r);
  EXPECT_TRUE(has(text, "parameters: 535,003,994,112 (535.00 B)")) << text;
  EXPECT_TRUE(has(text, "active parameters per token: 24,037,103,616 (24.04 B)")) << text;
  EXPECT_TRUE(has(text, "experts over 64 of the data ranks")) << text;
}
