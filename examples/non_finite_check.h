// train_gpt's check for a non-finite loss or gradient norm (Megatron-LM's
// --check-for-nan-in-loss-and-grad): each step's loss and the engine's gradient norm are tested
// on the device, into the first step that had a non-finite one, so that training waits on no
// host read per step; the log line, which reads the loss anyway, reads that step too.
//
// A step that fp16's (or bf16's check_grad_overflow) loss scaler skipped is not looked at: an
// overflow there is the scaler's to handle (it lowers the scale and retries), not a diverged run.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dscpp/comm/process_group.h"

namespace dscpp::examples {

// What stops a run at its first non-finite step: printed once (by rank 0), exit status 1.
class NonFiniteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class NonFiniteCheck {
 public:
  explicit NonFiniteCheck(at::Device device);

  // After optimizer step `step` (1-based, as the log counts): its loss on this rank (any shape
  // of one value; its mean over the micro-batches) and the engine's gradient norm of the step
  // (undefined: none yet), looked at only when `applied` (the loss scaler skipped no step).
  void after_step(int64_t step, const at::Tensor& loss, const at::Tensor& grad_norm, bool applied);

  // At a log line; collective over `group` (every rank calls it, and all get the same answer):
  // the first step since the last call whose loss on any rank, and the first whose gradient
  // norm, was not finite (0: none). Resets for the next interval.
  struct Found {
    int64_t loss_step = 0, grad_norm_step = 0;
    bool any() const { return loss_step > 0 || grad_norm_step > 0; }
    int64_t first() const;
    // "step 2: the loss is not finite (NaN or infinite)", the gradient norm also or instead.
    std::string describe() const;
  };
  Found take(comm::ProcessGroup& group);

 private:
  at::Device device_;
  at::Tensor first_loss_, first_norm_;  // 0-dim float64 on the device; +inf: none
};

}  // namespace dscpp::examples
