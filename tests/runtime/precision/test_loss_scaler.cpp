// Hand-computed sequences for LossScaler, following DeepSpeed's DynamicLossScaler.update_scale.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/runtime/precision/loss_scaler.h"

namespace dscpp {
namespace {

FP16Config dynamic_config(int64_t power, int64_t window, int64_t hysteresis, double min_scale = 1,
                          bool consecutive = false) {
  FP16Config c;
  c.enabled = true;
  c.loss_scale = 0;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min_scale;
  c.consecutive_hysteresis = consecutive;
  return c;
}

// Applies `steps` ('1' = overflow) and returns the scale after each.
std::vector<double> run(LossScaler& s, const std::string& steps) {
  std::vector<double> scales;
  for (char c : steps) {
    s.update_scale(c == '1');
    scales.push_back(s.loss_scale());
  }
  return scales;
}

using V = std::vector<double>;

TEST(LossScaler, StaticScaleNeverChanges) {
  FP16Config c;
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(run(s, "1101000111"), V(10, 128));
  // DeepSpeed's static LossScaler carries only these two attributes.
  EXPECT_EQ(s.state_dict(), (nlohmann::json{{"cur_scale", 128.0}, {"dynamic", false}}));
}

TEST(LossScaler, DisabledFp16ScalesByOne) {
  FP16Config c;  // enabled = false, whatever the other fields say
  c.loss_scale = 0;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(run(s, "111"), V(3, 1));
}

TEST(LossScaler, DynamicStartsAtTwoToInitialScalePower) {
  EXPECT_EQ(LossScaler(dynamic_config(16, 1000, 2)).loss_scale(), 65536);
  EXPECT_EQ(LossScaler(dynamic_config(0, 1000, 2)).loss_scale(), 1);
  EXPECT_EQ(LossScaler(dynamic_config(32, 1000, 2)).loss_scale(), 4294967296.0);
  EXPECT_TRUE(LossScaler(dynamic_config(16, 1000, 2)).dynamic());
}

TEST(LossScaler, HysteresisTwoHalvesOnTheSecondOverflow) {
  LossScaler s(dynamic_config(4, 1000, 2));
  // First overflow spends the hysteresis; the second halves; the budget stays at 1 (no
  // refill without a window's growth), so the third halves again.
  EXPECT_EQ(run(s, "111"), (V{16, 8, 4}));
  EXPECT_EQ(s.state_dict()["cur_hysteresis"], 1);
  EXPECT_EQ(s.state_dict()["last_overflow_iter"], 2);
}

TEST(LossScaler, HysteresisOneHalvesAtOnce) {
  LossScaler s(dynamic_config(4, 1000, 1));
  EXPECT_EQ(run(s, "11"), (V{8, 4}));
}

TEST(LossScaler, DoublesAfterScaleWindowGoodSteps) {
  LossScaler s(dynamic_config(4, 3, 1));
  // stable_interval = cur_iter - last_overflow_iter - 1 counts good steps before this one, so
  // the first doubling comes on the 4th good step (interval 3) and then every 3 steps.
  EXPECT_EQ(run(s, "0000000"), (V{16, 16, 16, 32, 32, 32, 64}));
  EXPECT_EQ(run(s, "1"), (V{32}));
  EXPECT_EQ(run(s, "00000"), (V{32, 32, 32, 64, 64}));
}

TEST(LossScaler, GrowthRefillsHysteresis) {
  LossScaler s(dynamic_config(4, 2, 2));
  // Overflow spends one; the doubling at interval 2 refills to 2, so it takes two more.
  EXPECT_EQ(run(s, "1000"), (V{16, 16, 16, 32}));
  EXPECT_EQ(s.state_dict()["cur_hysteresis"], 2);
  EXPECT_EQ(run(s, "11"), (V{32, 16}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryGoodStep) {
  LossScaler with(dynamic_config(4, 1000, 2, 1, true));
  EXPECT_EQ(run(with, "101010"), V(6, 16));
  EXPECT_EQ(run(with, "11"), (V{16, 8}));
  LossScaler without(dynamic_config(4, 1000, 2, 1, false));
  EXPECT_EQ(run(without, "10101"), (V{16, 16, 8, 8, 4}));
}

TEST(LossScaler, NeverBelowMinLossScaleAndRaisesThere) {
  LossScaler s(dynamic_config(4, 1000, 1, 3));
  EXPECT_EQ(run(s, "111"), (V{8, 4, 3}));  // max(4 / 2, 3)
  const nlohmann::json before = s.state_dict();
  // DeepSpeed's ZeRO scaler (raise_error_at_min_scale=True) raises here.
  EXPECT_THROW(s.update_scale(true), LossScaleAtMinimumError);
  EXPECT_EQ(s.state_dict(), before);
  EXPECT_EQ(run(s, "0"), (V{3}));  // good steps still work
}

TEST(LossScaler, HysteresisAtMinimumDoesNotRaise) {
  LossScaler s(dynamic_config(1, 1000, 2, 2));
  EXPECT_EQ(run(s, "1"), (V{2}));  // only spends hysteresis
  EXPECT_THROW(s.update_scale(true), LossScaleAtMinimumError);
}

TEST(LossScaler, ScaleBelowMinimumIsRaisedToIt) {
  // DeepSpeed compares cur_scale == min_scale exactly, so a start below the minimum is not
  // an error: max(1 / 2, 4) lifts it.
  LossScaler s(dynamic_config(0, 1000, 1, 4));
  EXPECT_EQ(run(s, "1"), (V{4}));
}

TEST(LossScaler, StateDictRoundTrip) {
  LossScaler a(dynamic_config(10, 5, 3, 1, true));
  run(a, "0110100000011");
  const nlohmann::json state = a.state_dict();
  EXPECT_EQ(state["cur_iter"], 13);
  EXPECT_EQ(state["last_overflow_iter"], 12);
  EXPECT_EQ(state["cur_hysteresis"], 1);
  EXPECT_EQ(state["cur_scale"], 2048.0);
  EXPECT_EQ(state["dynamic"], true);

  // As in DeepSpeed's ZeRO checkpoints, the saved settings replace the configured ones.
  LossScaler b(dynamic_config(2, 1000, 1));
  b.load_state_dict(state);
  EXPECT_EQ(b.state_dict(), state);
  const std::string more = "1000000000000111001";
  EXPECT_EQ(run(b, more), run(a, more));
  EXPECT_EQ(b.state_dict(), a.state_dict());
}

TEST(LossScaler, LoadWithoutSettingsKeepsConfiguredOnes) {
  LossScaler s(dynamic_config(4, 2, 1));
  s.load_state_dict(
      {{"cur_scale", 64.0}, {"cur_iter", 7}, {"last_overflow_iter", 6}, {"cur_hysteresis", 1}});
  EXPECT_EQ(run(s, "0001"), (V{64, 64, 128, 64}));
}

TEST(LossScaler, LoadingAStaticStateMakesTheScalerStatic) {
  LossScaler s(dynamic_config(4, 2, 1));
  s.load_state_dict({{"cur_scale", 32.0}, {"dynamic", false}});
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(run(s, "1010"), V(4, 32));
}

TEST(LossScaler, BadStateIsRejectedAndLeavesTheScalerAlone) {
  LossScaler s(dynamic_config(4, 2, 1));
  const nlohmann::json before = s.state_dict();
  EXPECT_THROW(s.load_state_dict({{"cur_scale", 8.0}}), dscpp::Error);
  EXPECT_THROW(s.load_state_dict({{"cur_scale", "8"}, {"dynamic", false}}), dscpp::Error);
  nlohmann::json bad = before;
  bad["cur_iter"] = 1.5;
  EXPECT_THROW(s.load_state_dict(bad), dscpp::Error);
  EXPECT_THROW(s.load_state_dict(nlohmann::json::array()), dscpp::Error);
  EXPECT_EQ(s.state_dict(), before);
}

TEST(LossScaler, RejectsWhatDeepSpeedsConfigRejects) {
  EXPECT_THROW(LossScaler(dynamic_config(4, 0, 2)), dscpp::Error);
  EXPECT_THROW(LossScaler(dynamic_config(4, 10, 2, 0)), dscpp::Error);
  FP16Config c;
  c.enabled = true;
  c.loss_scale = -1;
  EXPECT_THROW(LossScaler{c}, dscpp::Error);
}

}  // namespace
}  // namespace dscpp
