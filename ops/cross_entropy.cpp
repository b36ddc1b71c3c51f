// cross_entropy's two halves: argument checks, then the CUDA kernels (cross_entropy.cu) where
// they apply and the ATen composition of the same formulas everywhere else.
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>
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

void check_cross_entropy_args(const at::Tensor& logits, const at::Tensor& targets,
                              const char* where) {
  TORCH_CHECK(logits.defined() && targets.defined(), where, ": logits and targets must be defined");
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0), where,
              ": expected logits [N, V] and targets [N], got ", logits.sizes(), " and ",
              targets.sizes());
  TORCH_CHECK(logits.size(1) > 0, where, ": logits have no classes (V = 0)");
  TORCH_CHECK(at::isFloatingType(logits.scalar_type()), where,
              ": expected floating-point logits, got ", logits.scalar_type());
  TORCH_CHECK(targets.scalar_type() == at::kLong, where, ": expected int64 targets, got ",
              targets.scalar_type());
  TORCH_CHECK(logits.device() == targets.device(), where, ": logits are on ", logits.device(),
              ", targets on ", targets.device());
}

// The ATen path computes in fp32, or fp64 for fp64 logits (as torch's own kernels do).
at::ScalarType acc_type(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Targets with the ignored ones replaced by 0, so that every row can be gathered.
at::Tensor gatherable(const at::Tensor& targets, const at::Tensor& counted) {
  return at::where(counted, targets, 0).unsqueeze(1);
}

#ifdef DSCPP_CUDA
std::optional<cuda::DType> kernel_path(const at::Tensor& logits) {
  if (!logits.is_cuda()) return std::nullopt;
  return cuda::kernel_dtype(logits.scalar_type());
}

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

}  // namespace

CrossEntropyForward cross_entropy_forward(const at::Tensor& logits, const at::Tensor& targets,
                                          int64_t ignore_index) {
  check_cross_entropy_args(logits, targets, "cross_entropy");
  const int64_t vocab = logits.size(1);
#ifdef DSCPP_CUDA
  if (const auto dtype = kernel_path(logits)) {
    const int64_t rows = logits.size(0);
    const c10::cuda::CUDAGuard guard(logits.device());
    const at::Tensor lc = logits.contiguous();
    const at::Tensor tc = targets.contiguous();
    const auto f32 = lc.options().dtype(at::kFloat);
    CrossEntropyForward f{at::empty({}, f32), at::empty({rows}, f32), at::empty({}, f32)};
    at::Tensor row_loss = at::empty({rows}, f32);
    cuda::launch_cross_entropy_forward(
        lc.const_data_ptr(), tc.const_data_ptr<int64_t>(), rows, vocab, ignore_index, *dtype,
        f.lse.mutable_data_ptr<float>(), row_loss.mutable_data_ptr<float>(),
        f.loss.mutable_data_ptr<float>(), f.count.mutable_data_ptr<float>(), stream_of(logits));
    return f;
  }
#endif
  const at::Tensor counted = targets.ne(ignore_index);
  const at::Tensor index = gatherable(targets, counted);
  if (!logits.is_cuda()) {  // on a GPU gather's own device-side assert reports it
    TORCH_CHECK(index.ge(0).logical_and(index.lt(vocab)).all().item<bool>(),
                "cross_entropy: a target is outside [0, ", vocab, ") and not ignore_index (",
                ignore_index, ")");
  }
  const at::Tensor x = logits.to(acc_type(logits));
  CrossEntropyForward f;
  f.lse = at::logsumexp(x, {1});
  const at::Tensor row_loss = at::where(counted, f.lse.sub(x.gather(1, index).squeeze(1)), 0);
  f.count = counted.sum().to(x.scalar_type());
  f.loss = row_loss.sum().div(f.count);  // 0 / 0 = NaN when every row is ignored, as torch
  return f;
}

at::Tensor cross_entropy_backward(const at::Tensor& grad, const at::Tensor& logits,
                                  const at::Tensor& targets, const at::Tensor& lse,
                                  const at::Tensor& count, int64_t ignore_index) {
  check_cross_entropy_args(logits, targets, "cross_entropy backward");
#ifdef DSCPP_CUDA
  if (const auto dtype = kernel_path(logits); dtype && lse.scalar_type() == at::kFloat) {
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    const c10::cuda::CUDAGuard guard(logits.device());
    const at::Tensor lc = logits.contiguous();
    const at::Tensor tc = targets.contiguous();
    // A 0-d fp32 on the logits' device: the kernel reads it there, with no host round trip.
    const at::Tensor g = grad.to(lc.device(), at::kFloat).contiguous();
    // A fresh tensor rather than the logits' own storage: the caller may still hold the
    // logits (GPT returns them from forward), and the copy costs memory, not bandwidth.
    at::Tensor dlogits = at::empty(lc.sizes(), lc.options());
    cuda::launch_cross_entropy_backward(g.const_data_ptr<float>(), lc.const_data_ptr(),
                                        tc.const_data_ptr<int64_t>(), lse.const_data_ptr<float>(),
                                        count.const_data_ptr<float>(), rows, vocab, ignore_index,
                                        *dtype, dlogits.mutable_data_ptr(), stream_of(logits));
    return dlogits;
  }
#endif
  const at::Tensor counted = targets.ne(ignore_index);
  const at::Tensor index = gatherable(targets, counted);
  const at::Tensor x = logits.to(lse.scalar_type());
  // softmax - onehot(target), then scaled; ignored rows 0.
  at::Tensor d = at::exp(x.sub(lse.unsqueeze(1)));
  d.scatter_add_(1, index, at::full({logits.size(0), 1}, -1, d.options()));
  d = at::where(counted.unsqueeze(1), d.mul(grad.to(d.scalar_type()).div(count)), 0);
  return d.to(logits.scalar_type());
}

}  // namespace dscpp::ops::detail
