// swiglu's two halves: argument checks, then the CUDA kernels (swiglu.cu) where they apply and
// the ATen composition of the same formulas everywhere else.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
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

void check_input(const at::Tensor& x, const char* where) {
  TORCH_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) % 2 == 0, where,
              ": expected x [..., 2f] (gate then up), got ",
              x.defined() ? x.sizes() : at::IntArrayRef{});
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), where, ": expected a floating-point x, got ",
              x.scalar_type());
}

std::vector<int64_t> half_sizes(const at::Tensor& x) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  s.back() /= 2;
  return s;
}

#ifdef DSCPP_CUDA
cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

}  // namespace

at::Tensor swiglu_forward(const at::Tensor& x) {
  check_input(x, "swiglu");
  const int64_t f = x.size(-1) / 2;
#ifdef DSCPP_CUDA
  if (const auto dtype = x.is_cuda() ? cuda::kernel_dtype(x.scalar_type()) : std::nullopt) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty(half_sizes(xc), xc.options());
    if (f > 0)
      cuda::launch_swiglu_forward(xc.const_data_ptr(), y.mutable_data_ptr(), xc.numel() / (2 * f),
                                  f, *dtype, stream_of(xc));
    return y;
  }
#endif
  return at::mul(at::silu(x.narrow(-1, 0, f)), x.narrow(-1, f, f));
}

at::Tensor swiglu_backward(const at::Tensor& grad, const at::Tensor& x) {
  check_input(x, "swiglu backward");
  const int64_t f = x.size(-1) / 2;
  TORCH_CHECK(grad.defined() && grad.sizes() == at::IntArrayRef(half_sizes(x)),
              "swiglu backward: grad must be x's shape with the last dimension halved, got ",
              grad.defined() ? grad.sizes() : at::IntArrayRef{}, " for x ", x.sizes());
#ifdef DSCPP_CUDA
  if (const auto dtype = x.is_cuda() ? cuda::kernel_dtype(x.scalar_type()) : std::nullopt;
      dtype && grad.device() == x.device()) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous();
    const at::Tensor gc = grad.to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty(xc.sizes(), xc.options());
    if (f > 0)
      cuda::launch_swiglu_backward(gc.const_data_ptr(), xc.const_data_ptr(), dx.mutable_data_ptr(),
                                   xc.numel() / (2 * f), f, *dtype, stream_of(xc));
    return dx;
  }
#endif
  const at::Tensor gate = x.narrow(-1, 0, f), up = x.narrow(-1, f, f);
  return at::cat({at::silu_backward(at::mul(grad, up), gate), at::mul(grad, at::silu(gate))}, -1)
      .to(x.scalar_type());
}

}  // namespace dscpp::ops::detail
