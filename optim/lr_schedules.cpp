// DeepSpeed's five LR schedules, formula for formula (deepspeed/runtime/lr_schedules.py,
// v0.19.8): the same double arithmetic in the same order, so lrs agree to the last bit.
#include "dscpp/optim/lr_schedules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <vector>

#include "dscpp/config/config_error.h"
#include "dscpp/error.h"
#include "dscpp/optim/param_reader.h"

namespace dscpp::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, int64_t last_batch_iteration)
    : optimizer_(optimizer), last_batch_iteration_(last_batch_iteration) {}

void LRScheduler::step() {
  ++last_batch_iteration_;
  apply();
}

nlohmann::json LRScheduler::state_dict() const {
  return {{"last_batch_iteration", last_batch_iteration_}};
}

// DeepSpeed restores the lr with the optimizer's param_groups; our optimizer state holds no
// lr, so loading the schedule writes the lr it gives at that iteration.
void LRScheduler::load_state_dict(const nlohmann::json& state) {
  if (!state.is_object() || !state.contains("last_batch_iteration") ||
      !state["last_batch_iteration"].is_number_integer())
    throw dscpp::Error("LR scheduler state needs an integer last_batch_iteration");
  last_batch_iteration_ = state["last_batch_iteration"].get<int64_t>();
  apply();
}

void LRScheduler::apply() {
  optimizer_.set_lr(get_lr());
}

Hyper& LRScheduler::group(Optimizer& optimizer, int shard) {
  return shard < 0 ? optimizer.defaults_ : optimizer.shards_.at(shard).hyper;
}

namespace {

constexpr double kPi = 3.141592653589793;  // Python's math.pi

// A schedule maps each group's lr at construction (its base: WarmupCosineLR scales it,
// WarmupLR without warmup_max_lr warms up to it) to the group's lr now.
class Schedule : public LRScheduler {
 public:
  double get_lr() const override { return lr_for(base_lr(0)); }

  // DeepSpeed's constructors write the initial values only on a fresh start.
  void start() {
    if (last_batch_iteration_ == -1) apply();
  }

 protected:
  Schedule(Optimizer& optimizer, int64_t last_batch_iteration)
      : LRScheduler(optimizer, last_batch_iteration),
        base_default_(group(optimizer, -1).at("lr").get<double>()) {
    for (int i = 0; i < optimizer.num_shards(); ++i) base_.push_back(optimizer.get_lr(i));
  }

  virtual double lr_for(double base_lr) const = 0;

  double base_lr(int shard) const {
    return shard >= 0 && shard < static_cast<int>(base_.size()) ? base_[shard] : base_default_;
  }

  void apply() override {
    for (int i = -1; i < optimizer_.num_shards(); ++i)
      group(optimizer_, i)["lr"] = lr_for(base_lr(i));
  }

  double iteration() const { return static_cast<double>(last_batch_iteration_); }

 private:
  std::vector<double> base_;
  double base_default_;
};

int64_t read_start(ParamReader& r) {
  return r.integer("last_batch_iteration", -1, -1);
}

// DeepSpeed keeps at least 2 warmup steps (log(1) would divide by zero) and treats any
// warmup_type but "linear" as "log" (with a warning).
struct Warmup {
  int64_t steps;
  bool linear;
  double inverse_log;

  explicit Warmup(ParamReader& r) {
    steps = std::max<int64_t>(2, r.integer("warmup_num_steps", 1000, 1));
    linear = r.text("warmup_type", "log") == "linear";
    inverse_log = 1.0 / std::log(static_cast<double>(steps));
  }
  // Progress through warmup at iteration i (0 <= i < steps).
  double gamma(double i) const {
    return linear ? i / static_cast<double>(steps) : inverse_log * std::log(i + 1);
  }
};

// WarmupLR, and WarmupDecayLR (decay: linear down to 0 at total_num_steps).
class WarmupLR final : public Schedule {
 public:
  WarmupLR(Optimizer& optimizer, ParamReader& r, bool decay)
      : Schedule(optimizer, read_start(r)), warmup_(r) {
    if (decay) total_ = r.required_number("total_num_steps");
    min_lr_ = r.number("warmup_min_lr", 0.0);
    max_lr_ = r.optional_number("warmup_max_lr");
    // WarmupLR's warmup_max_lr defaults to None (each group's lr), WarmupDecayLR's to 0.001.
    if (decay && !r.contains("warmup_max_lr")) max_lr_ = 0.001;
  }

 protected:
  double lr_for(double base_lr) const override {
    if (last_batch_iteration_ < 0) return min_lr_;
    const double delta = max_lr_.value_or(base_lr) - min_lr_;
    return min_lr_ + delta * gamma();
  }

 private:
  double gamma() const {
    if (last_batch_iteration_ < warmup_.steps) return warmup_.gamma(iteration());
    if (!total_) return 1.0;
    return std::max(
        0.0, (*total_ - iteration()) / std::max(1.0, *total_ - static_cast<double>(warmup_.steps)));
  }

  Warmup warmup_;
  std::optional<double> total_;
  double min_lr_;
  std::optional<double> max_lr_;
};

// WarmupCosineLR: a ratio of each group's own lr, warming up from warmup_min_ratio to 1, then
// a half cosine down to cos_min_ratio at total_num_steps.
class WarmupCosineLR final : public Schedule {
 public:
  WarmupCosineLR(Optimizer& optimizer, ParamReader& r)
      : Schedule(optimizer, read_start(r)), warmup_(r) {
    total_ = r.required_number("total_num_steps");
    warmup_min_ratio_ = r.number("warmup_min_ratio", 0.0);
    cos_min_ratio_ = r.number("cos_min_ratio", 0.0001);
  }

 protected:
  double lr_for(double base_lr) const override {
    if (last_batch_iteration_ < 0) return 0.0;
    return base_lr * ratio();
  }

 private:
  double ratio() const {
    if (last_batch_iteration_ < warmup_.steps)
      return warmup_min_ratio_ + warmup_.gamma(iteration()) * (1. - warmup_min_ratio_);
    const double real_last_step = iteration() - static_cast<double>(warmup_.steps) + 1;
    const double real_total_steps = std::max(1.0, total_ - static_cast<double>(warmup_.steps));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double cosine = (1 + std::cos(kPi * progress)) / 2;
    return std::max(0.0, cos_min_ratio_ + (1. - cos_min_ratio_) * cosine);
  }

  Warmup warmup_;
  double total_;
  double warmup_min_ratio_;
  double cos_min_ratio_;
};

// OneCycle: lr up from cycle_min_lr to cycle_max_lr and back over one cycle (momentum the
// other way), then decay. As in DeepSpeed, momentum is cycled only for optimizers with
// betas (not SGD or Adagrad), and writing betas sets beta2 to 0.99.
class OneCycle final : public Schedule {
 public:
  OneCycle(Optimizer& optimizer, ParamReader& r) : Schedule(optimizer, read_start(r)) {
    min_lr_ = r.required_number("cycle_min_lr");
    max_lr_ = r.required_number("cycle_max_lr");
    decay_lr_rate_ = r.number("decay_lr_rate", 0.0);
    first_size_ = r.number("cycle_first_step_size", 2000);
    if (!(first_size_ > 0)) r.fail("cycle_first_step_size", "a number > 0");
    second_size_ = r.optional_number("cycle_second_step_size", 0).value_or(first_size_);
    first_stairs_ = r.number("cycle_first_stair_count", 0);
    second_stairs_ = r.optional_number("cycle_second_stair_count").value_or(first_stairs_);
    decay_step_size_ = r.number("decay_step_size", 0);
    cycle_momentum_ = r.flag("cycle_momentum", true) && group(optimizer, -1).contains("betas");
    min_mom_ = r.number("cycle_min_mom", 0.8);
    max_mom_ = r.number("cycle_max_mom", 0.9);
    decay_mom_rate_ = r.number("decay_mom_rate", 0.0);
    total_size_ = first_size_ + second_size_;
    step_ratio_ = first_size_ / total_size_;
    skip_lr_decay_ = decay_step_size_ == 0 || decay_lr_rate_ == 0;
    skip_mom_decay_ = decay_step_size_ == 0 || decay_mom_rate_ == 0;
  }

 protected:
  double lr_for(double) const override {
    if (iteration() < total_size_) return min_lr_ + (max_lr_ - min_lr_) * scale_factor();
    if (skip_lr_decay_) return min_lr_;
    const double interval = (iteration() - total_size_ + 1) / decay_step_size_;
    return min_lr_ / (1 + decay_lr_rate_ * interval);
  }

  void apply() override {
    Schedule::apply();
    if (!cycle_momentum_) return;
    // A fresh OneCycle starts at cycle_min_mom, although its formula gives cycle_max_mom.
    const double mom = last_batch_iteration_ < 0 ? min_mom_ : momentum();
    for (int i = -1; i < optimizer_.num_shards(); ++i) group(optimizer_, i)["betas"] = {mom, 0.99};
  }

 private:
  double momentum() const {
    if (iteration() < total_size_) return max_mom_ - (max_mom_ - min_mom_) * scale_factor();
    if (skip_mom_decay_) return max_mom_;
    const double interval = (iteration() - total_size_ + 1) / decay_step_size_;
    return max_mom_ * (1 + decay_mom_rate_ * interval);
  }

  double scale_factor() const {
    const double batch = iteration() + 1;
    const double cycle = std::floor(1 + batch / total_size_);
    const double x = 1. + batch / total_size_ - cycle;
    double scale, stairs;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stairs = first_stairs_;
    } else {
      scale = (x - 1) / (step_ratio_ - 1);
      stairs = second_stairs_;
    }
    if (stairs > 0) {
      const double in_cycle = std::fmod(batch, total_size_);
      const double position = in_cycle <= first_size_
                                  ? in_cycle * stairs / first_size_
                                  : (total_size_ - in_cycle) * stairs / second_size_;
      scale = std::floor(position) / stairs;
    }
    return scale;
  }

  double min_lr_, max_lr_, decay_lr_rate_;
  double first_size_, second_size_, first_stairs_, second_stairs_, decay_step_size_;
  bool cycle_momentum_;
  double min_mom_, max_mom_, decay_mom_rate_;
  double total_size_, step_ratio_;
  bool skip_lr_decay_, skip_mom_decay_;
};

// LRRangeTest: lr grows from lr_range_test_min_lr by step_rate per step_size steps.
class LRRangeTest final : public Schedule {
 public:
  LRRangeTest(Optimizer& optimizer, ParamReader& r) : Schedule(optimizer, read_start(r)) {
    min_lr_ = r.number("lr_range_test_min_lr", 1e-3);
    step_size_ = static_cast<double>(r.integer("lr_range_test_step_size", 2000, 1));
    step_rate_ = r.number("lr_range_test_step_rate", 1.0);
    staircase_ = r.flag("lr_range_test_staircase", false);
  }

 protected:
  double lr_for(double) const override {
    const double interval = (iteration() + 1) / step_size_;
    return min_lr_ * (1 + step_rate_ * (staircase_ ? std::floor(interval) : interval));
  }

 private:
  double min_lr_, step_size_, step_rate_;
  bool staircase_;
};

}  // namespace

std::unique_ptr<LRScheduler> make_scheduler(const SchedulerConfig& config, Optimizer& optimizer) {
  ParamReader r(config.params, "scheduler.params");
  std::unique_ptr<Schedule> s;
  // DeepSpeed looks the type up as a Python attribute: the spelling is exact.
  if (config.type == "WarmupLR")
    s = std::make_unique<WarmupLR>(optimizer, r, false);
  else if (config.type == "WarmupDecayLR")
    s = std::make_unique<WarmupLR>(optimizer, r, true);
  else if (config.type == "WarmupCosineLR")
    s = std::make_unique<WarmupCosineLR>(optimizer, r);
  else if (config.type == "OneCycle")
    s = std::make_unique<OneCycle>(optimizer, r);
  else if (config.type == "LRRangeTest")
    s = std::make_unique<LRRangeTest>(optimizer, r);
  else
    throw ConfigError("scheduler.type",
                      fmt::format("unknown scheduler '{}'; expected one of WarmupLR, "
                                  "WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest",
                                  config.type));
  r.finish();
  s->start();
  return s;
}

}  // namespace dscpp::optim
