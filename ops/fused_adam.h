// One fused CUDA kernel per Adam/AdamW update of a flat fp32 shard: torch.optim.Adam(W)'s
// single-tensor formula in one pass over param, grad, exp_avg and exp_avg_sq (read 4, write
// 3 floats an element), on the current CUDA stream of the tensors' device. The gradient may
// be bf16 or fp16 (ZeRO's 16-bit gradient partition): read as it is, widened exactly, so the
// update equals the one from grad.to(fp32) without that copy.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::ops::cuda {

struct AdamArgs {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;             // this update's step count, 1 for the first
  bool bias_correction = true;  // false: both corrections 1 (DeepSpeed's FusedAdam option)
  bool adam_w_mode = true;      // true: decoupled decay p *= 1 - lr*wd; false: L2, g += wd*p
  // A 0-dim fp32 tensor on the shard's device: the gradient counts as grad * grad_scale
  // (read on the device, so the host never waits for it). nullptr: 1. A non-finite scale
  // (an overflow, found on the device) skips the update: param, exp_avg and exp_avg_sq stay
  // as they are, and param_copy receives the unchanged parameters.
  const at::Tensor* grad_scale = nullptr;
  // A bf16 or fp16 tensor of the param's numel on its device (contiguous) that receives the
  // updated parameters, rounded to nearest even as Tensor::to() rounds: ZeRO's 16-bit
  // weights written from the kernel's registers instead of by a second pass. nullptr: none.
  const at::Tensor* param_copy = nullptr;
};

// Updates param, exp_avg and exp_avg_sq in place from grad. All four: defined, fp32 (grad
// also bf16 or fp16), contiguous, of the same numel, on the same CUDA device (any storage
// offset); a.param_copy as its comment says. Throws std::invalid_argument naming the tensor
// that is not, std::runtime_error on a CUDA error.
void fused_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                     at::Tensor& exp_avg_sq, const AdamArgs& a);

}  // namespace dscpp::ops::cuda
