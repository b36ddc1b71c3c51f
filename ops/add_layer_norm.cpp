// add_layer_norm's two halves: argument checks, then the CUDA kernels (add_layer_norm.cu)
// where they apply and ATen's native_layer_norm and its backward everywhere else (CPU, float64,
// mixed dtypes, and a backward of rows wider than kAddLayerNormBackwardMaxN).
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <vector>

#include "dscpp/ops/ops_impl.h"

#ifdef DSCPP_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dscpp/ops/kernel_dtype.h"
#include "dscpp/ops/kernel_launch.h"
#endif

namespace dscpp::ops::detail {
namespace {

void check_add_layer_norm_args(const at::Tensor& x, const at::Tensor& branch,
                               const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(x.defined() && branch.defined() && weight.defined() && bias.defined(),
              "add_layer_norm: x, branch, weight and bias must be defined");
  TORCH_CHECK(x.sizes() == branch.sizes(), "add_layer_norm: x is ", x.sizes(), ", branch is ",
              branch.sizes(), " (expected the same shape)");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && bias.dim() == 1 &&
                  weight.size(0) == x.size(-1) && bias.size(0) == x.size(-1),
              "add_layer_norm: expected x [..., n], weight [n] and bias [n], got ", x.sizes(), ", ",
              weight.sizes(), " and ", bias.sizes(),
              weight.numel() == 0 && x.size(-1) != 0
                  ? " (a ZeRO stage-3 parameter released before it was gathered?)"
                  : "");
  TORCH_CHECK(
      x.device() == branch.device() && x.device() == weight.device() && x.device() == bias.device(),
      "add_layer_norm: x, branch, weight and bias must share a device, got ", x.device(), ", ",
      branch.device(), ", ", weight.device(), ", ", bias.device());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()) && at::isFloatingType(branch.scalar_type()),
              "add_layer_norm: expected floating-point x and branch, got ", x.scalar_type(),
              " and ", branch.scalar_type());
}

#ifdef DSCPP_CUDA
// The kernels take x, branch, weight and bias of one 16/32-bit float dtype on a CUDA device.
std::optional<cuda::DType> kernel_path(const at::Tensor& x, const at::Tensor& branch,
                                       const at::Tensor& weight, const at::Tensor& bias) {
  const auto t = x.scalar_type();
  if (!x.is_cuda() || branch.scalar_type() != t || weight.scalar_type() != t ||
      bias.scalar_type() != t)
    return std::nullopt;
  return cuda::kernel_dtype(t);
}

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

}  // namespace

AddLayerNormForward add_layer_norm_forward(const at::Tensor& x, const at::Tensor& branch,
                                           const at::Tensor& weight, const at::Tensor& bias,
                                           double eps) {
  check_add_layer_norm_args(x, branch, weight, bias);
  const int64_t n = x.size(-1);
#ifdef DSCPP_CUDA
  if (const auto dtype = kernel_path(x, branch, weight, bias)) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous(), bc = branch.contiguous();
    const at::Tensor wc = weight.contiguous(), cc = bias.contiguous();
    AddLayerNormForward f;
    f.h = at::empty(xc.sizes(), xc.options());
    f.y = at::empty(xc.sizes(), xc.options());
    const int64_t rows = n == 0 ? 0 : xc.numel() / n;
    f.mean = at::empty({rows}, xc.options().dtype(at::kFloat));
    f.rstd = at::empty({rows}, xc.options().dtype(at::kFloat));
    cuda::launch_add_layer_norm_forward(
        xc.const_data_ptr(), bc.const_data_ptr(), wc.const_data_ptr(), cc.const_data_ptr(),
        f.h.mutable_data_ptr(), f.y.mutable_data_ptr(), f.mean.mutable_data_ptr<float>(),
        f.rstd.mutable_data_ptr<float>(), rows, n, static_cast<float>(eps), *dtype, stream_of(x));
    return f;
  }
#endif
  AddLayerNormForward f;
  f.h = at::add(x, branch);
  std::tie(f.y, f.mean, f.rstd) = at::native_layer_norm(f.h, {n}, weight, bias, eps);
  return f;
}

std::array<at::Tensor, 3> add_layer_norm_backward(const at::Tensor& dh, const at::Tensor& dy,
                                                  const at::Tensor& h, const at::Tensor& weight,
                                                  const at::Tensor& bias, const at::Tensor& mean,
                                                  const at::Tensor& rstd,
                                                  std::array<bool, 3> need) {
  TORCH_CHECK(!dh.defined() || dh.sizes() == h.sizes(), "add_layer_norm backward: dh is ",
              dh.sizes(), ", h is ", h.sizes());
  TORCH_CHECK(!dy.defined() || dy.sizes() == h.sizes(), "add_layer_norm backward: dy is ",
              dy.sizes(), ", h is ", h.sizes());
  TORCH_CHECK(weight.numel() == h.size(-1) && bias.numel() == h.size(-1),
              "add_layer_norm backward: weight ", weight.sizes(), " and bias ", bias.sizes(),
              " do not match h ", h.sizes(),
              " (a ZeRO stage-3 parameter released before it was gathered?)");
  if (!dh.defined() && !dy.defined()) return {};
  std::array<at::Tensor, 3> out;
  if (!dy.defined()) {  // y unused: the LayerNorm contributes nothing
    if (need[0]) out[0] = dh;
    if (need[1]) out[1] = at::zeros_like(weight);
    if (need[2]) out[2] = at::zeros_like(bias);
    return out;
  }
  const int64_t n = h.size(-1);
#ifdef DSCPP_CUDA
  if (const auto dtype = kernel_path(h, dy, weight, bias);
      dtype && n <= cuda::kAddLayerNormBackwardMaxN && dy.device() == h.device() &&
      (!dh.defined() || dh.scalar_type() == h.scalar_type())) {
    const c10::cuda::CUDAGuard guard(h.device());
    const at::Tensor hc = h.contiguous(), gc = dy.contiguous(), wc = weight.contiguous();
    const at::Tensor rc = dh.defined() ? dh.contiguous() : at::Tensor();
    const int64_t rows = n == 0 ? 0 : hc.numel() / n;
    // dx is always computed: the kernel's one pass yields it beside the partial sums.
    at::Tensor dx = at::empty(hc.sizes(), hc.options());
    at::Tensor dw = need[1] ? at::empty({n}, weight.options()) : at::Tensor();
    at::Tensor db = need[2] ? at::empty({n}, bias.options()) : at::Tensor();
    if (rows == 0) {
      if (need[1]) dw.zero_();
      if (need[2]) db.zero_();
    } else {
      at::Tensor ws = at::empty({cuda::add_layer_norm_backward_workspace(rows, n)},
                                hc.options().dtype(at::kFloat));
      cuda::launch_add_layer_norm_backward(
          gc.const_data_ptr(), rc.defined() ? rc.const_data_ptr() : nullptr, hc.const_data_ptr(),
          wc.const_data_ptr(), mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
          dx.mutable_data_ptr(), need[1] ? dw.mutable_data_ptr() : nullptr,
          need[2] ? db.mutable_data_ptr() : nullptr, ws.mutable_data_ptr<float>(), rows, n, *dtype,
          stream_of(h));
    }
    if (need[0]) out[0] = dx;
    out[1] = dw;
    out[2] = db;
    return out;
  }
#endif
  // The statistics as native_layer_norm shapes them, [..., 1] (the CUDA forward's are [rows]).
  std::vector<int64_t> stat_shape = h.sizes().vec();
  stat_shape.back() = 1;
  auto [dx, dw, db] =
      at::native_layer_norm_backward(dy, h, {n}, mean.reshape(stat_shape), rstd.reshape(stat_shape),
                                     weight, bias, {need[0], need[1], need[2]});
  if (need[0]) out[0] = dh.defined() ? dx.add(dh) : dx;
  if (need[1]) out[1] = dw;
  if (need[2]) out[2] = db;
  return out;
}

}  // namespace dscpp::ops::detail
