// DeepSpeed's LR schedules (deepspeed/runtime/lr_schedules.py) with their exact formulas:
// WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle (with momentum cycling), LRRangeTest.
// step() is called once per optimizer step and writes the new lr (and momentum) into the
// optimizer, as DeepSpeed's schedulers write into param_groups.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>

#include "dscpp/config/ds_config.h"
#include "dscpp/optim/optimizer.h"

namespace dscpp::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  // Advances one step (DeepSpeed: last_batch_iteration += 1) and applies it.
  void step();
  // The lr the schedule gives now, as DeepSpeed's get_lr()[0].
  virtual double get_lr() const = 0;
  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  // DeepSpeed's state_dict(): {"last_batch_iteration": N}; load applies it.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);

 protected:
  explicit LRScheduler(Optimizer& optimizer, int64_t last_batch_iteration = -1);
  // Writes the schedule's current values into the optimizer.
  virtual void apply();
  // A group's hyper-parameters, which DeepSpeed's schedules write one by one (per-group lrs,
  // OneCycle's betas); shard -1 is the optimizer's defaults, which later shards copy.
  static Hyper& group(Optimizer& optimizer, int shard);
  Optimizer& optimizer_;
  int64_t last_batch_iteration_;
};

// Builds the schedule the config names; throws ConfigError for unknown types or params.
std::unique_ptr<LRScheduler> make_scheduler(const SchedulerConfig& config, Optimizer& optimizer);

}  // namespace dscpp::optim
