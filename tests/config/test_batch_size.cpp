// DeepSpeed's batch-size rule: any two of the three give the third for the data-parallel
// size; all three must agree; the error shows the arithmetic.
#include <gtest/gtest.h>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"

using dscpp::ConfigOptions;
using dscpp::parse_ds_config;
using nlohmann::json;

namespace {
dscpp::DSConfig resolve(json j, int64_t world) {
  ConfigOptions o;
  o.world_size = world;
  return parse_ds_config(j, o);
}
void expect_triple(const dscpp::DSConfig& c, int64_t tb, int64_t mb, int64_t ga) {
  EXPECT_EQ(c.train_batch_size, tb);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, mb);
  EXPECT_EQ(c.gradient_accumulation_steps, ga);
}
}  // namespace

TEST(BatchSize, TrainAndMicroGiveAccumulation) {
  expect_triple(resolve({{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 4}}, 4), 64,
                4, 4);
}
TEST(BatchSize, TrainAndAccumulationGiveMicro) {
  expect_triple(resolve({{"train_batch_size", 64}, {"gradient_accumulation_steps", 2}}, 8), 64, 4,
                2);
}
TEST(BatchSize, MicroAndAccumulationGiveTrain) {
  expect_triple(
      resolve({{"train_micro_batch_size_per_gpu", 3}, {"gradient_accumulation_steps", 5}}, 2), 30,
      3, 5);
}
TEST(BatchSize, TrainAloneMeansNoAccumulation) {
  expect_triple(resolve({{"train_batch_size", 32}}, 8), 32, 4, 1);
}
TEST(BatchSize, MicroAloneMeansNoAccumulation) {
  expect_triple(resolve({{"train_micro_batch_size_per_gpu", 2}}, 8), 16, 2, 1);
}
TEST(BatchSize, AllThreeMustAgreeAndTheErrorShowsTheArithmetic) {
  try {
    resolve({{"train_batch_size", 10},
             {"train_micro_batch_size_per_gpu", 2},
             {"gradient_accumulation_steps", 2}},
            2);
    FAIL();
  } catch (const dscpp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train_batch_size (10) must equal "
                                         "train_micro_batch_size_per_gpu (2) * "
                                         "gradient_accumulation_steps (2) * data-parallel world "
                                         "size (2) = 8"),
              std::string::npos)
        << e.what();
  }
}
TEST(BatchSize, IndivisibleSizesAreRefusedLikeDeepSpeed) {
  // DeepSpeed floors 10 / 4 / 1 = 2 and then fails its check: 10 != 4 * 2 * 1.
  EXPECT_THROW(resolve({{"train_batch_size", 10}, {"train_micro_batch_size_per_gpu", 4}}, 1),
               dscpp::ConfigError);
  EXPECT_THROW(resolve({{"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 4}}, 8),
               dscpp::ConfigError);
}
// Each size derived from train_batch_size names the division that left a remainder: the two
// factors, their product, and the size that has no whole value.
TEST(BatchSize, EachDerivedSizeNamesTheDivisionThatFailed) {
  auto message = [](json j, int64_t world) -> std::string {
    try {
      resolve(j, world);
    } catch (const dscpp::ConfigError& e) {
      EXPECT_EQ(e.path(), "train_batch_size");
      return e.what();
    }
    return "(accepted)";
  };
  auto has = [](const std::string& m, const std::string& part) {
    return m.find(part) != std::string::npos;
  };
  std::string m = message({{"train_batch_size", 10}, {"train_micro_batch_size_per_gpu", 4}}, 2);
  EXPECT_TRUE(has(m,
                  "train_batch_size (10) is not a multiple of train_micro_batch_size_per_gpu "
                  "(4) * data-parallel world size (2) = 8, so gradient_accumulation_steps has "
                  "no whole value"))
      << m;
  m = message({{"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 4}}, 8);
  EXPECT_TRUE(has(m, "(4) * data-parallel world size (8) = 32, so gradient_accumulation_steps"))
      << m;
  m = message({{"train_batch_size", 10}, {"gradient_accumulation_steps", 3}}, 2);
  EXPECT_TRUE(has(m,
                  "train_batch_size (10) is not a multiple of gradient_accumulation_steps (3) "
                  "* data-parallel world size (2) = 6, so train_micro_batch_size_per_gpu has "
                  "no whole value"))
      << m;
  m = message({{"train_batch_size", 10}}, 4);
  EXPECT_TRUE(has(m,
                  "gradient_accumulation_steps (1, not given) * data-parallel world size (4) "
                  "= 4, so train_micro_batch_size_per_gpu has no whole value"))
      << m;
  m = message({{"train_batch_size", 10}, {"train_micro_batch_size_per_gpu", int64_t{1} << 62}}, 4);
  EXPECT_TRUE(has(m, "= more than 2^63")) << m;
}
TEST(BatchSize, NeitherTrainNorMicroIsAnError) {
  EXPECT_THROW(resolve({{"gradient_accumulation_steps", 2}}, 1), dscpp::ConfigError);
  EXPECT_THROW(resolve(json::object(), 1), dscpp::ConfigError);
}
TEST(BatchSize, AutoMustBeSuppliedByTheProgram) {
  json j = {{"train_batch_size", "auto"}, {"train_micro_batch_size_per_gpu", "auto"}};
  try {
    resolve(j, 1);
    FAIL();
  } catch (const dscpp::ConfigError& e) {
    EXPECT_EQ(e.path(), "train_batch_size");
  }
  ConfigOptions o;
  o.world_size = 2;
  o.auto_values = {{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}};
  expect_triple(parse_ds_config(j, o), 16, 4, 2);
}
TEST(BatchSize, ExponentFormIsAnInteger) {
  expect_triple(resolve({{"train_batch_size", 1.6e1}, {"train_micro_batch_size_per_gpu", 2}}, 2),
                16, 2, 4);
}
// DeepSpeed-Ulysses: the ranks of a sequence-parallel group share each sample, so the rule
// counts world / sequence_parallel_size data ranks (8 ranks, 2 a sequence: 4 data ranks).
TEST(BatchSize, SequenceParallelRanksShareTheirSamples) {
  const auto c = resolve({{"train_micro_batch_size_per_gpu", 2},
                          {"gradient_accumulation_steps", 3},
                          {"sequence_parallel_size", 2}},
                         8);
  expect_triple(c, 24, 2, 3);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.sequence_parallel_size, 2);
  expect_triple(resolve({{"train_batch_size", 16}, {"sequence_parallel_size", 4}}, 8), 16, 8, 1);
  try {
    resolve({{"train_micro_batch_size_per_gpu", 1}, {"sequence_parallel_size", 3}}, 8);
    FAIL() << "3 does not divide 8 ranks";
  } catch (const dscpp::ConfigError& e) {
    EXPECT_EQ(e.path(), "sequence_parallel_size");
    EXPECT_NE(std::string(e.what()).find("expected a divisor of 8, found 3"), std::string::npos)
        << e.what();
  }
}
