// LR schedules: the lr a fresh schedule writes, how step() moves it (worked out by hand from
// DeepSpeed's formulas), resuming from state_dict, and config errors with their JSON path.
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>

#include "dscpp/config/config_error.h"
#include "dscpp/optim/lr_schedules.h"

namespace {

using dscpp::ConfigError;
using dscpp::optim::LRScheduler;
using dscpp::optim::Optimizer;
using nlohmann::json;

std::unique_ptr<Optimizer> optimizer(const std::string& type, json params, int shards = 1) {
  dscpp::OptimizerConfig c;
  c.type = type;
  c.params = std::move(params);
  auto opt = dscpp::optim::make_optimizer(c);
  for (int i = 0; i < shards; ++i) opt->add_shard(at::zeros({2}));
  return opt;
}

std::unique_ptr<LRScheduler> schedule(const std::string& type, json params, Optimizer& opt) {
  dscpp::SchedulerConfig c;
  c.type = type;
  c.params = std::move(params);
  return dscpp::optim::make_scheduler(c, opt);
}

std::string schedule_error_path(const std::string& type, const json& params) {
  auto opt = optimizer("adam", json::object());
  try {
    schedule(type, params, *opt);
  } catch (const ConfigError& e) {
    return e.path();
  }
  return "";
}

TEST(WarmupLR, StartsAtTheMinimumAndWarmsUpLogarithmically) {
  auto opt = optimizer("adam", {{"lr", 0.5}});
  auto s =
      schedule("WarmupLR",
               {{"warmup_min_lr", 0.01}, {"warmup_max_lr", 0.1}, {"warmup_num_steps", 10}}, *opt);
  EXPECT_EQ(opt->get_lr(), 0.01);  // DeepSpeed's constructor writes min_lr
  EXPECT_EQ(s->last_batch_iteration(), -1);
  s->step();  // iteration 0: log(1) = 0
  EXPECT_EQ(opt->get_lr(), 0.01);
  s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.01 + 0.09 * std::log(2.0) / std::log(10.0));
  for (int i = 0; i < 20; ++i) s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.1);
  EXPECT_EQ(s->get_lr(), opt->get_lr());
}

TEST(WarmupLR, WithoutAMaximumWarmsUpToTheOptimizersLr) {
  auto opt = optimizer("sgd", {{"lr", 0.4}});
  auto s = schedule("WarmupLR", {{"warmup_num_steps", 4}, {"warmup_type", "linear"}}, *opt);
  EXPECT_EQ(opt->get_lr(), 0.0);
  s->step();
  s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.4 * 1 / 4);
}

TEST(WarmupDecayLR, DecaysLinearlyToZeroAndResumes) {
  auto opt = optimizer("adam", json::object());
  json params = {{"warmup_min_lr", 0.0},
                 {"warmup_max_lr", 0.1},
                 {"warmup_num_steps", 2},
                 {"warmup_type", "linear"},
                 {"total_num_steps", 10}};
  auto s = schedule("WarmupDecayLR", params, *opt);
  for (int i = 0; i < 6; ++i) s->step();  // iteration 5: (10 - 5) / (10 - 2)
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.1 * 5.0 / 8.0);
  json state = s->state_dict();
  EXPECT_EQ(state, json({{"last_batch_iteration", 5}}));

  auto opt2 = optimizer("adam", json::object());
  auto resumed = schedule("WarmupDecayLR", params, *opt2);
  resumed->load_state_dict(state);
  EXPECT_EQ(opt2->get_lr(), opt->get_lr());
  for (int i = 0; i < 10; ++i) resumed->step();
  EXPECT_EQ(opt2->get_lr(), 0.0);
}

TEST(WarmupDecayLR, MaxLrDefaultsTo0_001NotTheOptimizersLr) {
  auto opt = optimizer("adam", {{"lr", 0.5}});
  auto s = schedule("WarmupDecayLR", {{"warmup_num_steps", 1}, {"total_num_steps", 100}}, *opt);
  // warmup_num_steps is raised to 2: iteration 1 ends the warmup at the maximum
  for (int i = 0; i < 2; ++i) s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.001);
  for (int i = 0; i < 2; ++i) s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.001 * (100.0 - 3) / 98.0);
}

TEST(WarmupCosineLR, ScalesEachGroupsOwnLr) {
  auto opt = optimizer("adam", {{"lr", 0.2}});
  opt->add_shard(at::zeros({2}), {{"lr", 0.02}});
  auto s =
      schedule("WarmupCosineLR",
               {{"total_num_steps", 10}, {"warmup_num_steps", 2}, {"warmup_min_ratio", 0.5}}, *opt);
  EXPECT_EQ(opt->get_lr(0), 0.0);  // a fresh WarmupCosineLR writes 0
  EXPECT_EQ(opt->get_lr(1), 0.0);
  s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(0), 0.1);
  EXPECT_DOUBLE_EQ(opt->get_lr(1), 0.01);
  for (int i = 0; i < 5; ++i) s->step();  // iteration 5: progress (5 - 2 + 1) / 8
  const double ratio = 0.0001 + 0.9999 * (1 + std::cos(M_PI * 0.5)) / 2;
  EXPECT_DOUBLE_EQ(opt->get_lr(1), 0.02 * ratio);
  EXPECT_DOUBLE_EQ(s->get_lr(), 0.2 * ratio);
}

TEST(OneCycle, StartsAtMinimumsAndSetsBeta2To0_99) {
  auto opt = optimizer("adamw", {{"betas", {0.95, 0.999}}});
  auto s = schedule("OneCycle",
                    {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.11}, {"cycle_first_step_size", 4}},
                    *opt);
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(opt->get_momentum(), 0.8);
  EXPECT_DOUBLE_EQ(opt->hyper(0)["betas"][1].get<double>(), 0.99);
  s->step();  // batch 1 of a 4-step rise
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.01 + 0.1 * 0.25);
  EXPECT_DOUBLE_EQ(opt->get_momentum(), 0.9 - 0.1 * 0.25);
  for (int i = 0; i < 3; ++i) s->step();  // the peak
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.11);
  EXPECT_DOUBLE_EQ(opt->get_momentum(), 0.8);
}

TEST(OneCycle, LeavesSgdMomentumAloneAsDeepSpeed) {
  auto opt = optimizer("sgd", {{"momentum", 0.7}});
  auto s = schedule("OneCycle", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}}, *opt);
  s->step();
  EXPECT_DOUBLE_EQ(opt->get_momentum(), 0.7);
}

TEST(LRRangeTest, StaircaseGrowsInSteps) {
  auto opt = optimizer("adam", json::object());
  auto s = schedule("LRRangeTest",
                    {{"lr_range_test_min_lr", 0.01},
                     {"lr_range_test_step_size", 3},
                     {"lr_range_test_step_rate", 2.0},
                     {"lr_range_test_staircase", true}},
                    *opt);
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.01);
  s->step();
  s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.01);  // iteration 1: floor(2 / 3) = 0
  s->step();
  EXPECT_DOUBLE_EQ(opt->get_lr(), 0.03);  // iteration 2: floor(3 / 3) = 1
}

TEST(Schedules, ConfigErrorsNameTheKey) {
  EXPECT_EQ(schedule_error_path("WarmupLr", json::object()), "scheduler.type");
  EXPECT_EQ(schedule_error_path("CosineAnnealingLR", json::object()), "scheduler.type");
  EXPECT_EQ(schedule_error_path("WarmupDecayLR", json::object()),
            "scheduler.params.total_num_steps");
  EXPECT_EQ(schedule_error_path("WarmupCosineLR", {{"warmup_num_steps", 10}}),
            "scheduler.params.total_num_steps");
  EXPECT_EQ(schedule_error_path("WarmupLR", {{"warmup_num_steps", 0}}),
            "scheduler.params.warmup_num_steps");
  EXPECT_EQ(schedule_error_path("WarmupLR", {{"warmup_num_steps", 2.5}}),
            "scheduler.params.warmup_num_steps");
  EXPECT_EQ(schedule_error_path("WarmupLR", {{"warmup_max_lr", {0.1, 0.2}}}),
            "scheduler.params.warmup_max_lr");
  EXPECT_EQ(schedule_error_path("WarmupLR", {{"warmup_min_ratio", 0.1}}),
            "scheduler.params.warmup_min_ratio");
  EXPECT_EQ(schedule_error_path("OneCycle", {{"cycle_min_lr", 0.1}}),
            "scheduler.params.cycle_max_lr");
  EXPECT_EQ(
      schedule_error_path(
          "OneCycle", {{"cycle_min_lr", 0.1}, {"cycle_max_lr", 1}, {"cycle_first_step_size", 0}}),
      "scheduler.params.cycle_first_step_size");
  EXPECT_EQ(schedule_error_path("LRRangeTest", {{"lr_range_test_step_size", 0}}),
            "scheduler.params.lr_range_test_step_size");
  EXPECT_EQ(schedule_error_path("WarmupLR", {{"warmup_min_lr", 0}, {"warmup_max_lr", 0.1}}), "");
}

}  // namespace
