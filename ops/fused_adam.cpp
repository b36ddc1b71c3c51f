// fused_adam_step: checks the tensors, works out the update's scalars as torch does (in
// double, each rounded to float once) and launches the kernel on the current stream.
#include "dscpp/ops/fused_adam.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "dscpp/error.h"
#include "dscpp/ops/fused_adam_kernel.h"

namespace dscpp::ops::cuda {
namespace {

void check_tensor(const at::Tensor& t, const char* what, const at::Tensor& param,
                  bool sixteen_bit_ok = false, bool fp32_ok = true) {
  if (!t.defined()) throw dscpp::Error(fmt::format("fused_adam_step: {} is undefined", what));
  if (!t.is_cuda())
    throw dscpp::Error(
        fmt::format("fused_adam_step: {} is on {}, not a CUDA device", what, t.device().str()));
  const auto type = t.scalar_type();
  const bool sixteen = type == at::kBFloat16 || type == at::kHalf;
  if (!(fp32_ok && type == at::kFloat) && !(sixteen_bit_ok && sixteen))
    throw dscpp::Error(fmt::format("fused_adam_step: {} is {}, not {}", what, c10::toString(type),
                                   !fp32_ok         ? "bf16 or fp16"
                                   : sixteen_bit_ok ? "fp32, bf16 or fp16"
                                                    : "fp32"));
  if (!t.is_contiguous())
    throw dscpp::Error(fmt::format("fused_adam_step: {} is not contiguous", what));
  if (t.device() != param.device())
    throw dscpp::Error(fmt::format("fused_adam_step: {} is on {}, param on {}", what,
                                   t.device().str(), param.device().str()));
  if (t.numel() != param.numel())
    throw dscpp::Error(fmt::format("fused_adam_step: {} has {} elements, param {}", what, t.numel(),
                                   param.numel()));
}

}  // namespace

void fused_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                     at::Tensor& exp_avg_sq, const AdamArgs& a) {
  check_tensor(param, "param", param);
  check_tensor(grad, "grad", param, /*sixteen_bit_ok=*/true);
  check_tensor(exp_avg, "exp_avg", param);
  check_tensor(exp_avg_sq, "exp_avg_sq", param);
  if (a.step < 1) throw dscpp::Error(fmt::format("fused_adam_step: step is {}, not >= 1", a.step));
  if (param.numel() == 0) return;

  const double step = static_cast<double>(a.step);
  const double bc1 = a.bias_correction ? 1 - std::pow(a.beta1, step) : 1.0;
  const double bc2 = a.bias_correction ? 1 - std::pow(a.beta2, step) : 1.0;
  FusedAdamScalars s{};
  // With no weight decay both modes leave p and g alone: p * 1.0f is exact.
  s.decoupled = (a.adam_w_mode || a.weight_decay == 0) ? 1 : 0;
  s.decay = static_cast<float>(a.adam_w_mode ? 1 - a.lr * a.weight_decay : 1.0);
  s.l2 = static_cast<float>(a.adam_w_mode ? 0.0 : a.weight_decay);
  s.one_minus_b1 = static_cast<float>(1 - a.beta1);
  s.beta2 = static_cast<float>(a.beta2);
  s.one_minus_b2 = static_cast<float>(1 - a.beta2);
  s.bc2_sqrt = static_cast<float>(std::pow(bc2, 0.5));
  s.eps = static_cast<float>(a.eps);
  s.neg_step = static_cast<float>(-(a.lr / bc1));

  const float* grad_scale = nullptr;
  if (a.grad_scale) {
    const at::Tensor& gs = *a.grad_scale;
    if (!gs.defined() || gs.numel() != 1 || gs.scalar_type() != at::kFloat ||
        gs.device() != param.device())
      throw dscpp::Error(
          "fused_adam_step: grad_scale must be one fp32 element on the param's device");
    grad_scale = gs.data_ptr<float>();
  }
  void* copy = nullptr;
  CopyType copy_type = CopyType::kBFloat16;
  if (a.param_copy) {
    check_tensor(*a.param_copy, "param_copy", param, /*sixteen_bit_ok=*/true, /*fp32_ok=*/false);
    copy = a.param_copy->data_ptr();
    if (a.param_copy->scalar_type() == at::kHalf) copy_type = CopyType::kHalf;
  }
  const c10::cuda::CUDAGuard guard(param.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(param.device().index()).stream();
  const GradType g_type = grad.scalar_type() == at::kBFloat16 ? GradType::kBFloat16
                          : grad.scalar_type() == at::kHalf   ? GradType::kHalf
                                                              : GradType::kFloat;
  launch_fused_adam(param.data_ptr<float>(), grad.const_data_ptr(), g_type,
                    exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(), param.numel(), s,
                    grad_scale, copy, copy_type, stream);
}

}  // namespace dscpp::ops::cuda
