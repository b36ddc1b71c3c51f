// NonFiniteCheck: the first non-finite step, found on the device.
#include "non_finite_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dscpp::examples {

namespace {

constexpr double kNone = std::numeric_limits<double>::infinity();

// `first` lowered to `step` where `value` is not finite: no host read, a few scalar kernels.
at::Tensor lower_where_not_finite(const at::Tensor& first, const at::Tensor& value, int64_t step) {
  const at::Tensor finite = value.detach().to(first.device()).isfinite().all();
  at::Tensor candidate = at::full({}, static_cast<double>(step), first.options());
  candidate.masked_fill_(finite, kNone);
  return at::minimum(first, candidate);
}

}  // namespace

NonFiniteCheck::NonFiniteCheck(at::Device device) : device_(device) {
  const auto options = at::TensorOptions().dtype(at::kDouble).device(device);
  first_loss_ = at::full({}, kNone, options);
  first_norm_ = at::full({}, kNone, options);
}

void NonFiniteCheck::after_step(int64_t step, const at::Tensor& loss, const at::Tensor& grad_norm,
                                bool applied) {
  if (!applied) return;
  first_loss_ = lower_where_not_finite(first_loss_, loss, step);
  if (grad_norm.defined()) first_norm_ = lower_where_not_finite(first_norm_, grad_norm, step);
}

NonFiniteCheck::Found NonFiniteCheck::take(comm::ProcessGroup& group) {
  at::Tensor both = at::stack({first_loss_, first_norm_});
  group.all_reduce(both, comm::ReduceOp::kMin).wait();
  both = both.to(at::kCPU);
  auto step_of = [](double v) { return std::isfinite(v) ? static_cast<int64_t>(v) : 0; };
  Found f;
  f.loss_step = step_of(both[0].item<double>());
  f.grad_norm_step = step_of(both[1].item<double>());
  first_loss_.fill_(kNone);
  first_norm_.fill_(kNone);
  return f;
}

int64_t NonFiniteCheck::Found::first() const {
  if (loss_step == 0) return grad_norm_step;
  if (grad_norm_step == 0) return loss_step;
  return std::min(loss_step, grad_norm_step);
}

std::string NonFiniteCheck::Found::describe() const {
  const int64_t s = first();
  const bool loss = loss_step == s, norm = grad_norm_step == s;
  return fmt::format("step {}: {} not finite (NaN or infinite)", s,
                     loss && norm ? "the loss and the gradient norm are"
                     : loss       ? "the loss is"
                                  : "the gradient norm is");
}

}  // namespace dscpp::examples
