// EngineCore::log_progress: the progress lines the reporting rank (one in the job) prints every
// steps_per_print steps, in DeepSpeed's form (step, lr, loss scale, grad norm, samples/s), and
// under wall_clock_breakdown the timers' and ZeRO's phase times since the last line, which it
// then resets.
#include <fmt/format.h>

#include <iostream>

#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/precision/loss_scaler.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

void EngineCore::log_progress() {
  auto now = std::chrono::steady_clock::now();
  double secs = std::chrono::duration<double>(now - last_log_).count();
  if (reporter_)
    std::cout << fmt::format(
                     "[dscpp] step={}, skipped={}, lr=[{:.6g}], mom=[{:.6g}], loss_scale={:g}, "
                     "grad_norm={:.4g}, samples/sec={:.2f}\n",
                     global_steps_, skipped_steps_, zero_->optimizer().get_lr(),
                     zero_->optimizer().get_momentum(), scaler_->loss_scale(),
                     get_global_grad_norm(), secs > 0 ? samples_since_log_ / secs : 0.0)
              << std::flush;
  if (config_.wall_clock_breakdown && reporter_)
    std::cout << fmt::format(
                     "[dscpp] time (ms) | forward: {:.2f} | backward: {:.2f} | backward_inner: "
                     "{:.2f} | backward_allreduce: {:.2f} | step: {:.2f}\n",
                     timers_.forward, timers_.backward, timers_.backward - timers_.backward_reduce,
                     timers_.backward_reduce, timers_.step)
              << std::flush;
  if (config_.wall_clock_breakdown) {
    // Where the step's host time went, ZeRO's phases (zero/phase_times.h: the offloaded step's
    // landings, sum of squares, CPU update and waits), over the same steps.
    const zero::PhaseTimes phases = zero_->take_phase_times();
    std::string line;
    for (const auto& [name, ms] : phases) line += fmt::format(" | {}: {:.2f}", name, ms);
    if (reporter_ && !line.empty())
      std::cout << "[dscpp] zero phases (ms)" << line << "\n" << std::flush;
  }
  timers_ = Timers();
  last_log_ = now;
  samples_since_log_ = 0;
}

}  // namespace dscpp
