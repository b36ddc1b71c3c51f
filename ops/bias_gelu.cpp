// bias_gelu's two halves: argument checks, then the CUDA kernels (bias_gelu.cu) where they
// apply and the ATen composition of the same formulas everywhere else.
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>

#include "dscpp/ops/ops_impl.h"

#ifdef DSCPP_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dscpp/ops/kernel_dtype.h"
#include "dscpp/ops/kernel_launch.h"
#endif

namespace dscpp::ops::detail {
namespace {

void check_bias_gelu_args(const at::Tensor& x, const at::Tensor& bias, const char* where) {
  TORCH_CHECK(x.defined() && bias.defined(), where, ": x and bias must be defined");
  TORCH_CHECK(x.dim() >= 1 && bias.dim() == 1 && x.size(-1) == bias.size(0), where,
              ": expected x [..., n] and bias [n], got ", x.sizes(), " and ", bias.sizes(),
              bias.numel() == 0 && x.size(-1) != 0
                  ? " (a ZeRO stage-3 parameter released before it was gathered?)"
                  : "");
  TORCH_CHECK(x.device() == bias.device(), where, ": x is on ", x.device(), ", bias on ",
              bias.device());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()) && at::isFloatingType(bias.scalar_type()), where,
              ": expected floating-point x and bias, got ", x.scalar_type(), " and ",
              bias.scalar_type());
}

const char* approximation(bool tanh_approximation) {
  return tanh_approximation ? "tanh" : "none";
}

#ifdef DSCPP_CUDA
// The kernels take x and bias of one 16/32-bit float dtype on a CUDA device.
std::optional<cuda::DType> kernel_path(const at::Tensor& x, const at::Tensor& bias) {
  if (!x.is_cuda() || x.scalar_type() != bias.scalar_type()) return std::nullopt;
  return cuda::kernel_dtype(x.scalar_type());
}

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

}  // namespace

at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, bool tanh_approximation) {
  check_bias_gelu_args(x, bias, "bias_gelu");
#ifdef DSCPP_CUDA
  if (const auto dtype = kernel_path(x, bias)) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous();
    const at::Tensor bc = bias.contiguous();
    at::Tensor y = at::empty(xc.sizes(), xc.options());
    const int64_t n = bias.size(0);
    if (n == 0) return y;
    cuda::launch_bias_gelu_forward(xc.const_data_ptr(), bc.const_data_ptr(), y.mutable_data_ptr(),
                                   xc.numel() / n, n, *dtype, tanh_approximation, stream_of(x));
    return y;
  }
#endif
  return at::gelu(x.add(bias), approximation(tanh_approximation));
}

std::pair<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad, const at::Tensor& x,
                                                     const at::Tensor& bias,
                                                     bool tanh_approximation, bool need_dx,
                                                     bool need_dbias) {
  check_bias_gelu_args(x, bias, "bias_gelu backward");
  TORCH_CHECK(grad.sizes() == x.sizes(), "bias_gelu backward: grad is ", grad.sizes(), ", x is ",
              x.sizes());
  if (!need_dx && !need_dbias) return {};
  const int64_t n = bias.size(0);
#ifdef DSCPP_CUDA
  if (const auto dtype = kernel_path(x, bias); dtype && grad.device() == x.device()) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous();
    const at::Tensor bc = bias.contiguous();
    // The grad of the output, which has x's dtype (autograd casts it there).
    const at::Tensor gc = grad.to(x.scalar_type()).contiguous();
    at::Tensor dx = need_dx ? at::empty(xc.sizes(), xc.options()) : at::Tensor();
    at::Tensor dbias = need_dbias ? at::empty({n}, bias.options()) : at::Tensor();
    if (n == 0) return {dx, dbias};
    const int64_t rows = xc.numel() / n;
    at::Tensor workspace;
    if (need_dbias)
      workspace = at::empty({cuda::bias_gelu_partial_rows(rows, n, *dtype) * n},
                            xc.options().dtype(at::kFloat));
    cuda::launch_bias_gelu_backward(gc.const_data_ptr(), xc.const_data_ptr(), bc.const_data_ptr(),
                                    need_dx ? dx.mutable_data_ptr() : nullptr,
                                    need_dbias ? dbias.mutable_data_ptr() : nullptr,
                                    need_dbias ? workspace.mutable_data_ptr<float>() : nullptr,
                                    rows, n, *dtype, tanh_approximation, stream_of(x));
    return {dx, dbias};
  }
#endif
  // d gelu(z) / dz at z = x + bias, in the promoted dtype of x and bias (what forward gave).
  const at::Tensor dz = at::gelu_backward(grad, x.add(bias), approximation(tanh_approximation));
  at::Tensor dx, dbias;
  if (need_dx) dx = dz.to(x.scalar_type());
  if (need_dbias && n == 0) {
    dbias = at::empty({0}, bias.options());
  } else if (need_dbias) {
    const auto acc = dz.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    dbias = at::sum(dz.reshape({-1, n}), {0}, /*keepdim=*/false, acc).to(bias.scalar_type());
  }
  return {dx, dbias};
}

}  // namespace dscpp::ops::detail
