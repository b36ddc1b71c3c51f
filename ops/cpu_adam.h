// The CPU optimizers of ZeRO-Offload (DeepSpeed's DeepSpeedCPUAdam, DeepSpeedCPUAdagrad,
// DeepSpeedCPULion): one pass over an fp32 partition and its fp32 state, vectorised with
// ATen's at::vec for the best instruction set this CPU has (AVX-512, AVX2 or the portable
// build, chosen at run time by ATen's at::get_cpu_capability(), so ATEN_CPU_CAPABILITY caps it as
// it caps ATen), and split over LibTorch's intra-op thread count. The same pass reads a 16-bit
// gradient (widened as it is read), multiplies it by grad_scale (the unscale and clip), and
// writes the updated parameters' 16-bit (or fp32) copy, so the partition is read once.
//
// The arithmetic is DeepSpeed's, in fp32 with its order of operations (csrc/includes/
// cpu_adam.h, cpu_adagrad.h, cpu_lion.h); the per-step scalars (bias corrections, decayed
// learning rate) are computed in double and rounded once. Lion's sign(0) is 0 (as the paper
// and dscpp's ATen Lion), where DeepSpeed's CPU kernel steps by -lr.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

namespace dscpp::ops::cpu {

struct AdamArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // the step being taken, counted from 1
  bool bias_correction = true;
  bool adam_w_mode = true;  // decoupled weight decay (AdamW); false: L2 (grad += wd * p)
};

struct AdagradArgs {
  double lr = 1e-2, eps = 1e-10, weight_decay = 0;
  double lr_decay = 0;  // torch.optim.Adagrad's: lr / (1 + (step - 1) * lr_decay)
  int64_t step = 1;
};

struct LionArgs {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.99, weight_decay = 0;
};

// What every step takes besides its state. param: 1-D contiguous fp32, updated in place.
// grad: fp32, bf16 or fp16, contiguous, param's size. grad_scale: each gradient counts as
// grad * grad_scale. param_copy: undefined, or fp32 / bf16 / fp16 contiguous of param's size,
// receives the updated parameters. Every tensor on the CPU; a bad one throws dscpp::Error.
struct StepTensors {
  at::Tensor param;
  at::Tensor grad;
  float grad_scale = 1.0f;
  at::Tensor param_copy;
};

// exp_avg, exp_avg_sq: fp32 state of param's size, updated in place.
void adam_step(const StepTensors& t, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
               const AdamArgs& args);
// sum: Adagrad's accumulator (DeepSpeed's exp_avg_sq).
void adagrad_step(const StepTensors& t, const at::Tensor& sum, const AdagradArgs& args);
void lion_step(const StepTensors& t, const at::Tensor& exp_avg, const LionArgs& args);

// The instruction set the kernels run with here: "AVX512", "AVX2" or "DEFAULT".
std::string capability();
// Threads a step splits into (LibTorch's intra-op thread count).
int threads();
// fn over [0, n) cut as a step of n elements is cut (whole 1024-element tiles, the same threads
// and pool): for references that must move memory exactly as the kernels do (the benchmark's).
void for_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace dscpp::ops::cpu
