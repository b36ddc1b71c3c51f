// The step's one computation of the gradient norm, the clip and the unscale (DeepSpeed's
// combined unscale and clip), from the global sum of squares of the gradient partition. It is
// written once, over a scalar type: double when the overflow check has brought the sum to the
// host anyway, a 0-dim float64 tensor when the sum stays on the device (the step then enqueues
// without waiting for it). Both evaluate the same float64 operations in the same order, so
// they agree to the bit.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace dscpp::zero {

struct StepScaleInputs {
  double loss_scale = 1.0;  // what the loss was multiplied by
  // What the reduced gradients still have to be multiplied by to be averages (1, or 1/world
  // for a 16-bit partition that holds sums: GradBuckets::deferred_scale()).
  double deferred = 1.0;
  double clip = 0.0;  // gradient_clipping; 0: none
};

template <typename T>
struct StepScale {
  T norm;   // global norm of the unscaled, averaged gradients, before clipping
  T scale;  // what the partition's gradients are multiplied by before the update
};

namespace step_scale_ops {
inline double sqrt_of(double x) {
  return std::sqrt(x);
}
inline at::Tensor sqrt_of(const at::Tensor& x) {
  return x.sqrt();
}
inline double at_least_one(double x) {
  return std::max(x, 1.0);
}
inline at::Tensor at_least_one(const at::Tensor& x) {
  return x.clamp_min(1.0);
}
inline double reciprocal_of(double x) {
  return 1.0 / x;
}
inline at::Tensor reciprocal_of(const at::Tensor& x) {
  return x.reciprocal();
}
inline double constant_like(double, double value) {
  return value;
}
inline at::Tensor constant_like(const at::Tensor& like, double value) {
  return at::full({}, value, like.options());
}
}  // namespace step_scale_ops

// sumsq: the global sum of squares of the partition's gradients as they are (scaled by the
// loss scale, and sums rather than averages where in.deferred != 1).
template <typename T>
StepScale<T> unscale_and_clip(const T& sumsq, const StepScaleInputs& in) {
  using namespace step_scale_ops;
  T norm = sqrt_of(sumsq);
  if (in.deferred != 1.0) norm = norm * in.deferred;
  norm = norm / in.loss_scale;
  // Divide by the loss scale, and further by (norm + 1e-6) / clip when that exceeds 1.
  T combined = constant_like(norm, in.loss_scale);
  if (in.clip > 0) combined = combined * at_least_one((norm + 1e-6) / in.clip);
  T scale = reciprocal_of(combined);
  if (in.deferred != 1.0) scale = scale * in.deferred;
  return {norm, scale};
}

}  // namespace dscpp::zero
