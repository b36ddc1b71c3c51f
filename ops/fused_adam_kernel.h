// The plain interface between the host wrapper (fused_adam.cpp, C++ with LibTorch) and the
// kernel (fused_adam.cu, nvcc): pointers, sizes and the update's float scalars only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dscpp::ops::cuda {

// The update's scalars as torch's float kernels see them (each rounded from double once).
struct FusedAdamScalars {
  float decay;         // AdamW: 1 - lr*wd (1 when wd is 0)
  float l2;            // Adam: wd (0 when AdamW or wd is 0)
  float one_minus_b1;  // lerp weight
  float beta2;
  float one_minus_b2;
  float bc2_sqrt;  // sqrt(bias_correction2)
  float eps;
  float neg_step;  // -lr / bias_correction1
  int decoupled;   // 1: apply decay; 0: apply l2 (when nonzero)
};

// The gradient's element type: fp32, or the 16-bit types ZeRO keeps reduced gradients in
// (each element widened to float as it is read, exactly).
enum class GradType { kFloat, kBFloat16, kHalf };

// The type of the updated parameters' 16-bit copy the kernel also writes (ZeRO's published
// bf16/fp16 weights), rounded to nearest even as Tensor::to() rounds.
enum class CopyType { kBFloat16, kHalf };
// Launches the update of n elements on stream (the current device must be the tensors').
// Throws std::runtime_error naming the failing CUDA call, file and line.
// grad_scale: a device pointer to one float multiplying every gradient, or nullptr; a
// non-finite one skips the update (p, m, v unchanged; copy, if any, receives p).
// copy: n elements of copy_type receiving the updated parameters, or nullptr.
void launch_fused_adam(float* p, const void* g, GradType g_type, float* m, float* v, int64_t n,
                       const FusedAdamScalars& s, const float* grad_scale, void* copy,
                       CopyType copy_type, cudaStream_t stream);

}  // namespace dscpp::ops::cuda
