// Bad input: each error names the JSON path, what was expected and what was found; unknown
// keys warn with the closest known key (errors in strict mode); unimplemented features that
// would change training are refused by name.
#include <gtest/gtest.h>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "tests/config/config_test_util.h"

using config_test::parse;
using dscpp::ConfigError;
using dscpp::ConfigOptions;
using dscpp::parse_ds_config;
using nlohmann::json;

namespace {
std::string error_of(json j, bool strict = false) {
  if (!j.contains("train_micro_batch_size_per_gpu")) j["train_micro_batch_size_per_gpu"] = 1;
  ConfigOptions o;
  o.strict = strict;
  try {
    parse_ds_config(j, o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ConfigErrors, WrongTypeNamesPathExpectationAndValue) {
  EXPECT_EQ(error_of({{"zero_optimization", {{"stage", "two"}}}}),
            "zero_optimization.stage: expected an integer in [0, 3], found \"two\"");
  EXPECT_EQ(error_of({{"zero_optimization", {{"stage", 4}}}}),
            "zero_optimization.stage: expected an integer in [0, 3], found 4");
  EXPECT_EQ(error_of({{"fp16", {{"enabled", "yes"}}}}),
            "fp16.enabled: expected true or false, found \"yes\"");
  EXPECT_EQ(error_of({{"zero_optimization", {{"reduce_bucket_size", 0}}}}),
            "zero_optimization.reduce_bucket_size: expected an integer >= 1, found 0");
  EXPECT_EQ(error_of({{"zero_optimization", {{"allgather_bucket_size", 1.5}}}}),
            "zero_optimization.allgather_bucket_size: expected an integer >= 0, found 1.5");
  EXPECT_EQ(error_of({{"zero_optimization", 3}}), "zero_optimization: expected an object, found 3");
  EXPECT_EQ(error_of({{"gradient_clipping", "1.0"}}),
            "gradient_clipping: expected a finite number >= 0, found \"1.0\"");
}

TEST(ConfigErrors, CommunicationDataTypeMustBeKnown) {
  EXPECT_EQ(
      error_of({{"communication_data_type", "bfp16"}}),
      "communication_data_type: expected one of \"fp32\", \"fp16\", \"bf16\", found \"bfp16\"");
  EXPECT_EQ(*parse({{"communication_data_type", "BF16"}}).communication_data_type, "bf16");
}

TEST(ConfigErrors, UnknownKeyWarnsWithTheClosestKnownKey) {
  auto c = parse({{"zero_optimization", {{"stage", 3}, {"stage3_param_persitence_threshold", 10}}},
                  {"bp16", {{"enabled", true}}}});
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_NE(c.warnings[0].find("'zero_optimization.stage3_param_persitence_threshold' (did you "
                               "mean 'zero_optimization.stage3_param_persistence_threshold'?)"),
            std::string::npos)
      << c.warnings[0];
  EXPECT_NE(c.warnings[1].find("'bp16' (did you mean 'bf16'?)"), std::string::npos)
      << c.warnings[1];
}

TEST(ConfigErrors, StrictModeMakesUnknownKeysErrors) {
  EXPECT_EQ(error_of({{"zero_optimization", {{"overlap_com", true}}}}, true),
            "zero_optimization.overlap_com: unknown key (did you mean "
            "'zero_optimization.overlap_comm'?)");
  EXPECT_EQ(error_of({{"zero_optimization", {{"overlap_com", true}}}}, false), "");
}

TEST(ConfigErrors, RemovedFeaturesAreRefusedByNameUnlessDisabled) {
  EXPECT_NE(error_of({{"progressive_layer_drop", {{"enabled", true}}}})
                .find("progressive layer dropping"),
            std::string::npos);
  EXPECT_NE(error_of({{"amp", {{"enabled", true}}}}).find("Apex AMP"), std::string::npos);
  auto c = parse({{"amp", {{"enabled", false}}}});
  ASSERT_EQ(c.ignored.size(), 1u);
}

TEST(ConfigErrors, NvmeOffloadNeedsItsPath) {
  // ZeRO-Infinity's swap files need a folder, as DeepSpeed asserts; with one it loads.
  EXPECT_EQ(
      error_of({{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "nvme"}}}}}}),
      "zero_optimization.offload_param.nvme_path: expected the folder for NVMe offload's "
      "swap files (device \"nvme\"), found nothing");
  EXPECT_EQ(
      error_of({{"zero_optimization",
                 {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", ""}}}}}}),
      "zero_optimization.offload_optimizer.nvme_path: expected the folder for NVMe "
      "offload's swap files (device \"nvme\"), found nothing");
  EXPECT_EQ(
      error_of({{"zero_optimization",
                 {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/x"}}}}},
                {"aio", {{"block_size", 4096}, {"queue_depth", 4}, {"thread_count", 2}}}}),
      "");
  EXPECT_EQ(error_of({{"aio", {{"queue_depth", 0}}}}),
            "aio.queue_depth: expected an integer >= 1, found 0");
}

TEST(ConfigErrors, UnknownOptimizerAndSchedulerSuggestTheClosest) {
  EXPECT_NE(error_of({{"optimizer", {{"type", "Adamm"}}}}).find("(did you mean 'Adam'?)"),
            std::string::npos);
  EXPECT_EQ(error_of({{"scheduler", {{"type", "WarmupCosine"}}}}),
            "scheduler.type: scheduler 'WarmupCosine' is not supported by dscpp; expected one of "
            "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest (did you mean "
            "'WarmupCosineLR'?)");
}

TEST(ConfigErrors, UnresolvedAutoInOptimizerParamsNamesTheKey) {
  EXPECT_EQ(error_of({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}}}}}}),
            "optimizer.params.lr: is \"auto\" and no value was supplied for it: pass it to "
            "dscpp::initialize (auto_values) or write a number in the config");
}

// A caller with its own way of filling "auto"s (dscpp_report's --auto) names it instead, at
// each place an unfilled one is found: the batch sizes, the optimizer's and the schedule's params.
TEST(ConfigErrors, UnresolvedAutoNamesTheCallersWayOfFillingIt) {
  ConfigOptions o;
  o.auto_values_hint = "give it with --auto KEY=VALUE";
  auto message = [&](const json& j) -> std::string {
    try {
      parse_ds_config(j, o);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const std::string tail =
      "is \"auto\" and no value was supplied for it: give it with --auto "
      "KEY=VALUE or write a number in the config";
  EXPECT_EQ(message({{"train_batch_size", "auto"}}), "train_batch_size: " + tail);
  EXPECT_EQ(message({{"train_batch_size", 1},
                     {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}}}}}}),
            "optimizer.params.lr: " + tail);
  EXPECT_EQ(
      message({{"train_batch_size", 1},
               {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
               {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", "auto"}}}}}}),
      "scheduler.params.warmup_num_steps: " + tail);
}

TEST(ConfigErrors, Fp16AndBf16TogetherAreRefused) {
  EXPECT_EQ(error_of({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}),
            "bf16.enabled: fp16 and bf16 cannot both be enabled");
}

TEST(ConfigErrors, DeprecatedKeyWithItsReplacementIsRefused) {
  EXPECT_NE(error_of({{"zero_optimization",
                       {{"cpu_offload", true}, {"offload_optimizer", {{"device", "cpu"}}}}}})
                .find("given together with 'offload_optimizer'"),
            std::string::npos);
}
