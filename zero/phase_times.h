// Host time spent in the phases of ZeRO's step, for DeepSpeed's wall_clock_breakdown: where the
// offloaded step's seconds go (landing the gradients, the host sum of squares, the CPU
// optimizer, the waits for copies and for overlapped updates). Each part keeps milliseconds of
// the host's wall clock in its own fields, summed since the last take (no device
// synchronisation: on a GPU a phase counts what the host spent in it, computing or waiting);
// ZeroOptimizer::take_phase_times() collects them by name and starts them again at zero.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace dscpp::zero {

// Named milliseconds, in the order the parts report them.
using PhaseTimes = std::vector<std::pair<std::string, double>>;

// Adds the time from construction to destruction to `ms`.
class PhaseTimer {
 public:
  explicit PhaseTimer(double& ms) : ms_(ms), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
               .count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double& ms_;
  std::chrono::steady_clock::time_point start_;
};

// Appends {name, ms} to `times` and zeroes ms.
inline void take_phase(PhaseTimes& times, const char* name, double& ms) {
  times.emplace_back(name, ms);
  ms = 0;
}

}  // namespace dscpp::zero
