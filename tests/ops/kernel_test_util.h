// What the fused-op tests share: the relative error they judge by, a finite-difference
// gradient check, and seeded random inputs.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace dscpp::ops::test {

// ||got - want|| / ||want|| in float64 on the CPU (||got - want|| where want is all zeros).
inline double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kCPU, at::kDouble);
  const at::Tensor w = want.detach().to(at::kCPU, at::kDouble);
  const double diff = g.sub(w).norm().item<double>();
  const double scale = w.norm().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// A float64 CPU tensor of N(0, scale^2) values from a seeded generator.
inline at::Tensor randn64(at::IntArrayRef sizes, double scale = 1.0) {
  return at::randn(sizes, at::TensorOptions().dtype(at::kDouble)).mul_(scale);
}

// The largest |analytic - numeric| over every element of every input, where analytic is what
// autograd gives for sum(f(inputs) * weights) and numeric its central difference with step
// eps. Inputs: float64 leaves with requires_grad; weights: f's output shape.
inline double max_gradient_error(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                                 const std::vector<at::Tensor>& inputs, const at::Tensor& weights,
                                 double eps = 1e-6) {
  for (const auto& in : inputs) in.mutable_grad() = at::Tensor();
  f(inputs).mul(weights).sum().backward();
  double worst = 0.0;
  const c10::NoGradGuard no_grad;
  for (const auto& in : inputs) {
    const at::Tensor analytic = in.grad().defined() ? in.grad() : at::zeros_like(in);
    at::Tensor flat = in.view({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double orig = flat[i].item<double>();
      flat[i].fill_(orig + eps);
      const double up = f(inputs).mul(weights).sum().item<double>();
      flat[i].fill_(orig - eps);
      const double down = f(inputs).mul(weights).sum().item<double>();
      flat[i].fill_(orig);
      const double numeric = (up - down) / (2 * eps);
      worst = std::max(worst, std::abs(numeric - analytic.view({-1})[i].item<double>()));
    }
  }
  return worst;
}

}  // namespace dscpp::ops::test
