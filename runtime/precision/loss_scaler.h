// Loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py): a static
// scale, or a dynamic one that starts at 2^initial_scale_power, halves after `hysteresis`
// overflowing steps (never below min_loss_scale), and doubles after loss_scale_window
// steps without overflow; consecutive_hysteresis refills the hysteresis budget on every
// good step. Whether a step overflowed is decided by the caller (the engine agrees on it
// across ranks first); update_scale() is called once per optimizer step with that verdict.
//
// This is the scaler DeepSpeed's ZeRO optimizers (stages 1-3) use. Its non-ZeRO fp16
// optimizers (FP16_Optimizer, FP16_UnfusedOptimizer) keep their own copy of the rule that
// ignores hysteresis (halves on every overflow) and never raises at the minimum.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "dscpp/config/ds_config.h"
#include "dscpp/error.h"

namespace dscpp {

// Thrown by update_scale() on an overflow that would halve a scale already at min_loss_scale.
// DeepSpeed's ZeRO optimizers build DynamicLossScaler with raise_error_at_min_scale=True (its
// default; the config cannot change it) and raise there, ending the run.
class LossScaleAtMinimumError : public Error {
 public:
  using Error::Error;
};

class LossScaler {
 public:
  // From the fp16 section: static when loss_scale > 0, dynamic when 0. A disabled fp16
  // section gives scale 1, never changing.
  explicit LossScaler(const FP16Config& config);

  double loss_scale() const { return cur_scale_; }
  bool dynamic() const { return dynamic_; }
  // Applies one step's verdict, exactly as DeepSpeed's DynamicLossScaler.update_scale. A
  // static scaler ignores it. Throws LossScaleAtMinimumError (state unchanged) as above.
  void update_scale(bool overflow);

  // DeepSpeed's checkpointed fields: cur_scale, cur_iter, last_overflow_iter, cur_hysteresis.
  // ZeRO pickles the whole scaler object, so its settings (scale_window, min_scale,
  // delayed_shift, consecutive_hysteresis, scale_factor, dynamic) are saved too and, as in
  // DeepSpeed, a loaded checkpoint's settings replace the configured ones. Loading accepts a
  // state without the settings (keeps the configured ones); throws std::invalid_argument on
  // a missing or mistyped field.
  nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& state);

 private:
  bool dynamic_;
  double cur_scale_;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int64_t scale_window_;
  double min_scale_;
  int64_t delayed_shift_;
  int64_t cur_hysteresis_;
  bool consecutive_hysteresis_;
  double scale_factor_ = 2.0;
};

}  // namespace dscpp
