// The host side of the vocabulary-parallel kernels (vocab_parallel_cross_entropy.cu).
#include "dscpp/ops/vocab_parallel_kernels.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#ifdef DSCPP_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dscpp/ops/kernel_dtype.h"
#include "dscpp/ops/kernel_launch.h"
#endif

namespace dscpp::ops::vocab_parallel {

bool kernels_apply(const at::Tensor& logits) {
#ifdef DSCPP_CUDA
  return logits.defined() && logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous() &&
         cuda::kernel_dtype(logits.scalar_type()).has_value();
#else
  (void)logits;
  return false;
#endif
}

#ifdef DSCPP_CUDA
namespace {

cuda::DType checked(const at::Tensor& logits, const at::Tensor& targets, const char* where) {
  TORCH_CHECK(kernels_apply(logits), where,
              ": expected contiguous 2-d CUDA logits of bf16, fp16 or fp32, got ", logits.sizes(),
              " ", logits.scalar_type(), " on ", logits.device());
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.dim() == 1 &&
                  targets.size(0) == logits.size(0) && targets.device() == logits.device() &&
                  targets.is_contiguous(),
              where, ": expected contiguous int64 targets [", logits.size(0), "] on ",
              logits.device(), ", got ", targets.sizes(), " ", targets.scalar_type());
  return *cuda::kernel_dtype(logits.scalar_type());
}

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

void check_row_values(const at::Tensor& v, const at::Tensor& logits, const char* what) {
  TORCH_CHECK(v.scalar_type() == at::kFloat && v.dim() == 1 && v.size(0) == logits.size(0) &&
                  v.is_contiguous() && v.device() == logits.device(),
              "vocab_parallel: ", what, " must be contiguous fp32 [", logits.size(0), "] on ",
              logits.device());
}

}  // namespace

at::Tensor row_max(const at::Tensor& logits) {
  TORCH_CHECK(kernels_apply(logits), "vocab_parallel::row_max: logits not on the kernel path");
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor out = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  cuda::launch_vocab_parallel_max(logits.const_data_ptr(), logits.size(0), logits.size(1),
                                  *cuda::kernel_dtype(logits.scalar_type()),
                                  out.mutable_data_ptr<float>(), stream_of(logits));
  return out;
}

at::Tensor sums(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                const at::Tensor& row_max) {
  const cuda::DType dtype = checked(logits, targets, "vocab_parallel::sums");
  check_row_values(row_max, logits, "row_max");
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor out = at::empty({2, logits.size(0)}, logits.options().dtype(at::kFloat));
  cuda::launch_vocab_parallel_sum_exp(logits.const_data_ptr(), targets.const_data_ptr<int64_t>(),
                                      logits.size(0), logits.size(1), start,
                                      row_max.const_data_ptr<float>(), dtype,
                                      out.mutable_data_ptr<float>(), stream_of(logits));
  return out;
}

at::Tensor grad(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& targets,
                int64_t start, const at::Tensor& row_max, const at::Tensor& sum_exp) {
  const cuda::DType dtype = checked(logits, targets, "vocab_parallel::grad");
  check_row_values(row_max, logits, "row_max");
  check_row_values(sum_exp, logits, "sum_exp");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor g = grad.to(logits.device(), at::kFloat).reshape({-1}).contiguous();
  check_row_values(g, logits, "grad");
  at::Tensor out = at::empty(logits.sizes(), logits.options());
  cuda::launch_vocab_parallel_backward(
      g.const_data_ptr<float>(), logits.const_data_ptr(), targets.const_data_ptr<int64_t>(),
      logits.size(0), logits.size(1), start, row_max.const_data_ptr<float>(),
      sum_exp.const_data_ptr<float>(), dtype, out.mutable_data_ptr(), stream_of(logits));
  return out;
}

#else

at::Tensor row_max(const at::Tensor&) {
  TORCH_CHECK(false, "vocab_parallel::row_max: a CUDA build's kernel");
}
at::Tensor sums(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&) {
  TORCH_CHECK(false, "vocab_parallel::sums: a CUDA build's kernel");
}
at::Tensor grad(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&,
                const at::Tensor&) {
  TORCH_CHECK(false, "vocab_parallel::grad: a CUDA build's kernel");
}

#endif

}  // namespace dscpp::ops::vocab_parallel
