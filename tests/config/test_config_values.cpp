// Effective values: DeepSpeed's defaults (hand-copied from its v0.19.8 code), aliases,
// deprecated spellings, and "auto" inside sections.
#include <gtest/gtest.h>

#include "dscpp/config/ds_config.h"
#include "tests/config/config_test_util.h"

using config_test::parse;
using dscpp::ConfigOptions;
using dscpp::parse_ds_config;
using nlohmann::json;

TEST(ConfigValues, DefaultsAreDeepSpeeds) {
  auto c = parse(json::object());
  EXPECT_FALSE(c.steps_per_print.has_value());
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_DOUBLE_EQ(c.fp16.loss_scale, 0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_DOUBLE_EQ(c.fp16.min_loss_scale, 1);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_TRUE(c.bf16.check_grad_overflow);
  const auto& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1000000000);
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_FALSE(z.offload_optimizer.has_value());
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_EQ(c.checkpoint.tag_validation, "WARN");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_TRUE(c.ignored.empty());
}

TEST(ConfigValues, OverlapCommDefaultsOnOnlyForStage3) {
  for (int stage : {0, 1, 2, 3})
    EXPECT_EQ(parse({{"zero_optimization", {{"stage", stage}}}}).zero_optimization.overlap_comm,
              stage == 3);
  EXPECT_FALSE(parse({{"zero_optimization", {{"stage", 3}, {"overlap_comm", false}}}})
                   .zero_optimization.overlap_comm);
}

TEST(ConfigValues, Stage3KeysReadUnderBothNames) {
  auto a = parse(
      {{"zero_optimization", {{"stage3_max_live_parameters", 7}, {"max_reuse_distance", 9}}}});
  EXPECT_EQ(a.zero_optimization.stage3_max_live_parameters, 7);
  EXPECT_EQ(a.zero_optimization.stage3_max_reuse_distance, 9);
  auto b = parse({{"zero_optimization", {{"gather_16bit_weights_on_model_save", true}}}});
  EXPECT_TRUE(b.zero_optimization.stage3_gather_16bit_weights_on_model_save);
}

TEST(ConfigValues, DeprecatedSpellingsMapToTheirReplacements) {
  auto c = parse({{"zero_optimization",
                   {{"stage", 2},
                    {"cpu_offload", true},
                    {"stage3_gather_fp16_weights_on_model_save", true}}}});
  ASSERT_TRUE(c.zero_optimization.offload_optimizer.has_value());
  EXPECT_EQ(c.zero_optimization.offload_optimizer->device, "cpu");
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.warnings.size(), 2u);
  auto old_bf16 = parse({{"bfloat16", {{"enabled", true}}}});
  EXPECT_TRUE(old_bf16.bf16.enabled);
  auto zero_bool = parse({{"zero_optimization", true}});
  EXPECT_EQ(zero_bool.zero_optimization.stage, 1);
}

TEST(ConfigValues, AutoInsideASectionMeansTheDefault) {
  auto c = parse({{"fp16", {{"enabled", "auto"}, {"loss_scale_window", "auto"}}},
                  {"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_size", "auto"}}}});
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
}

TEST(ConfigValues, SuppliedAutoValuesReplaceOnlyAuto) {
  ConfigOptions o;
  o.auto_values = {{"optimizer.params.lr", 0.5},
                   {"optimizer.params.eps", 1e-3},
                   {"zero_optimization.reduce_bucket_size", 1024}};
  json j = {{"train_micro_batch_size_per_gpu", 1},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"eps", 1e-8}}}}},
            {"zero_optimization", {{"reduce_bucket_size", "auto"}}}};
  auto c = parse_ds_config(j, o);
  EXPECT_EQ(c.optimizer->type, "adamw");
  EXPECT_DOUBLE_EQ(c.optimizer->params["lr"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer->params["eps"].get<double>(), 1e-8);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 1024);
}

TEST(ConfigValues, OptimizerNamesNormaliseLikeDeepSpeed) {
  EXPECT_EQ(parse({{"optimizer", {{"type", "Adam"}}}}).optimizer->type, "adam");
  EXPECT_EQ(parse({{"optimizer", {{"type", "LAMB"}}}}).optimizer->type, "lamb");
  // torch.optim names are not DeepSpeed's own: kept as written.
  EXPECT_EQ(parse({{"optimizer", {{"type", "SGD"}}}}).optimizer->type, "SGD");
  // DeepSpeed-only params such as torch_adam are accepted as they are.
  auto c = parse({{"optimizer", {{"type", "AdamW"}, {"params", {{"torch_adam", true}}}}}});
  EXPECT_EQ(c.optimizer->params["torch_adam"], true);
}

TEST(ConfigValues, OneBitOptimizersRunUncompressedAndSaySo) {
  auto c = parse({{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"lr", 1e-3}}}}}});
  ASSERT_EQ(c.ignored.size(), 1u);
  EXPECT_NE(c.ignored[0].find("OneBitAdam"), std::string::npos);
}

TEST(ConfigValues, ObserversAreAnnouncedAsIgnored) {
  auto c = parse({{"flops_profiler", {{"enabled", true}}},
                  {"wandb", {{"enabled", false}}},
                  {"comms_logger", {{"enabled", true}}}});
  EXPECT_EQ(c.ignored.size(), 1u);      // comms_logger; the flops profiler is implemented
  EXPECT_TRUE(c.wall_clock_breakdown);  // flops_profiler turns it on, as in DeepSpeed
}

TEST(ConfigValues, GradientClippingTrueIsOneAsInPython) {
  auto c = parse({{"gradient_clipping", true}});
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.warnings.size(), 1u);
}

TEST(ConfigValues, ToJsonHoldsEveryEffectiveValue) {
  auto j =
      dscpp::to_json(parse({{"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 2e8}}}}));
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 200000000);
  EXPECT_EQ(j["zero_optimization"]["overlap_comm"], false);
  EXPECT_EQ(j["train_batch_size"], 1);
  EXPECT_TRUE(j["steps_per_print"].is_null());
  EXPECT_TRUE(j["zero_optimization"]["offload_param"].is_null());
}
