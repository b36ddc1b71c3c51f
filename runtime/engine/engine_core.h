// The engine's real work, independent of the user's module type: config, process group,
// precision, ZeRO, optimizer and LR schedule, the micro-step / boundary bookkeeping, and
// DeepSpeed's progress lines. Engine<M> (runtime/engine/engine.h) is a thin shell over it.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/process_group.h"
#include "runtime/config/ds_config.h"

namespace dscpp {

namespace optim {
class LRScheduler;
}
namespace zero {
class ZeroOptimizer;
}
class LossScaler;

// What initialize() takes besides the module and the config.
struct InitArgs {
  nlohmann::json auto_values = nlohmann::json::object();  // values for "auto" keys
  std::shared_ptr<comm::ProcessGroup> group;  // data-parallel group; default: init_distributed()
  bool strict_config = false;
};

class EngineCore {
 public:
  // Moves the module to the training dtype and device.
  using ModuleCast = std::function<void(at::ScalarType, at::Device)>;
  using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

  EngineCore(const nlohmann::json& config, InitArgs args);
  ~EngineCore();
  // Second half of construction, once the module is known.
  void attach(const ModuleCast& cast, const std::function<NamedParams()>& named_params);

  void backward(const at::Tensor& loss);
  void step();
  // Around the module's forward, for wall_clock_breakdown.
  void forward_begin();
  void forward_end();

  bool is_gradient_accumulation_boundary() const;
  int64_t global_steps() const { return global_steps_; }
  int64_t global_samples() const { return global_samples_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t micro_steps() const { return micro_steps_; }
  std::vector<double> get_lr() const;
  double get_global_grad_norm() const { return grad_norm_; }
  double loss_scale() const;
  bool was_step_applied() const { return step_applied_; }
  int64_t train_micro_batch_size_per_gpu() const { return config_.train_micro_batch_size_per_gpu; }
  int64_t train_batch_size() const { return config_.train_batch_size; }
  int64_t gradient_accumulation_steps() const { return config_.gradient_accumulation_steps; }
  int zero_optimization_stage() const { return config_.zero_optimization.stage; }
  int local_rank() const { return local_rank_; }
  int world_size() const { return group_->size(); }
  int global_rank() const { return group_->rank(); }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }
  const DSConfig& config() const { return config_; }
  comm::ProcessGroup& group() { return *group_; }
  zero::ZeroOptimizer& zero_optimizer() { return *zero_; }
  optim::LRScheduler* lr_scheduler() { return scheduler_.get(); }

 private:
  void log_progress();
  // wall_clock_breakdown: milliseconds spent per phase since the last progress line.
  struct Timers {
    double forward = 0, backward = 0, backward_reduce = 0, step = 0;
  };
  double now_ms();  // waits for the device first, so GPU work is counted where it ran

  DSConfig config_;
  std::shared_ptr<comm::ProcessGroup> group_;
  int local_rank_ = 0;
  at::Device device_ = at::kCPU;
  at::ScalarType dtype_ = at::kFloat;
  std::unique_ptr<zero::ZeroOptimizer> zero_;
  std::unique_ptr<optim::LRScheduler> scheduler_;
  std::unique_ptr<LossScaler> scaler_;
  int64_t micro_steps_ = 0, global_steps_ = 0, global_samples_ = 0, skipped_steps_ = 0;
  double grad_norm_ = 0.0;
  bool step_applied_ = false;
  std::chrono::steady_clock::time_point last_log_;
  int64_t samples_since_log_ = 0;
  Timers timers_;
  double forward_start_ = 0;
};

}  // namespace dscpp
