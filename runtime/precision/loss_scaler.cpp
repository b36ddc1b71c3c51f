#include "dscpp/runtime/precision/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "dscpp/error.h"

namespace dscpp {

LossScaler::LossScaler(const FP16Config& config)
    : dynamic_(config.enabled && config.loss_scale == 0),
      cur_scale_(1.0),
      scale_window_(config.loss_scale_window),
      min_scale_(config.min_loss_scale),
      delayed_shift_(config.hysteresis),
      cur_hysteresis_(config.hysteresis),
      consecutive_hysteresis_(config.consecutive_hysteresis) {
  // Without fp16 DeepSpeed still builds a static scaler of 1 (CreateLossScaler).
  if (!config.enabled) return;
  if (config.loss_scale < 0 || !std::isfinite(config.loss_scale)) {
    throw dscpp::Error("fp16.loss_scale must be a finite number >= 0");
  }
  if (!dynamic_) {
    cur_scale_ = config.loss_scale;
    return;
  }
  // DeepSpeed's config rejects these for dynamic scaling; a zero window would otherwise be a
  // division by zero in update_scale.
  if (scale_window_ <= 0) {
    throw dscpp::Error("fp16.loss_scale_window must be > 0 for dynamic loss scaling");
  }
  if (!(min_scale_ > 0)) {
    throw dscpp::Error("fp16.min_loss_scale must be > 0 for dynamic loss scaling");
  }
  cur_scale_ = std::ldexp(1.0, static_cast<int>(config.initial_scale_power));
}

void LossScaler::update_scale(bool overflow) {
  // LossScalerBase.update_scale only logs: a static scale and its counters never move.
  if (!dynamic_) return;
  if (overflow) {
    if (delayed_shift_ == 1 || cur_hysteresis_ == 1) {
      // DeepSpeed compares exactly; a scale below the minimum (an initial scale under it) is
      // raised to the minimum by the max() instead.
      if (cur_scale_ == min_scale_) {
        throw LossScaleAtMinimumError(
            "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
      }
      cur_scale_ = std::max(cur_scale_ / scale_factor_, min_scale_);
      // cur_hysteresis stays at 1: every further overflow halves until a refill.
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
    // Good steps since the last overflow, not counting this one.
    const int64_t stable_interval = cur_iter_ - last_overflow_iter_ - 1;
    if (stable_interval > 0 && stable_interval % scale_window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = delayed_shift_;
      cur_scale_ *= scale_factor_;
    }
  }
  ++cur_iter_;
}

nlohmann::json LossScaler::state_dict() const {
  // Mirrors the attributes of the object DeepSpeed pickles: LossScaler has only these two.
  nlohmann::json state = {{"cur_scale", cur_scale_}, {"dynamic", dynamic_}};
  if (!dynamic_) return state;
  state["cur_iter"] = cur_iter_;
  state["last_overflow_iter"] = last_overflow_iter_;
  state["cur_hysteresis"] = cur_hysteresis_;
  state["scale_factor"] = scale_factor_;
  state["scale_window"] = scale_window_;
  state["min_scale"] = min_scale_;
  state["delayed_shift"] = delayed_shift_;
  state["consecutive_hysteresis"] = consecutive_hysteresis_;
  return state;
}

namespace {

template <typename T>
void read_field(const nlohmann::json& state, const char* key, bool required, T& out) {
  auto it = state.find(key);
  if (it == state.end()) {
    if (required) throw dscpp::Error(std::string("loss scaler state lacks ") + key);
    return;
  }
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer();
  } else {
    ok = it->is_number();
  }
  if (!ok) throw dscpp::Error(std::string("loss scaler state: bad ") + key);
  out = it->get<T>();
}

}  // namespace

void LossScaler::load_state_dict(const nlohmann::json& state) {
  if (!state.is_object()) throw dscpp::Error("loss scaler state must be an object");
  // Filled into a copy so that a bad state leaves this scaler untouched.
  LossScaler next = *this;
  read_field(state, "dynamic", false, next.dynamic_);
  read_field(state, "cur_scale", true, next.cur_scale_);
  if (next.dynamic_) {
    read_field(state, "cur_iter", true, next.cur_iter_);
    read_field(state, "last_overflow_iter", true, next.last_overflow_iter_);
    read_field(state, "cur_hysteresis", true, next.cur_hysteresis_);
    read_field(state, "scale_factor", false, next.scale_factor_);
    read_field(state, "scale_window", false, next.scale_window_);
    read_field(state, "min_scale", false, next.min_scale_);
    read_field(state, "delayed_shift", false, next.delayed_shift_);
    read_field(state, "consecutive_hysteresis", false, next.consecutive_hysteresis_);
    if (next.scale_window_ <= 0) {
      throw dscpp::Error("loss scaler state: scale_window must be > 0");
    }
  }
  *this = next;
}

}  // namespace dscpp
