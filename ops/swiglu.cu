// The SwiGLU kernels (kernel_launch.h; fused_ops.h for the contract). Elementwise over the F
// output columns of each row: one thread per 16-byte pack of the gate half, reading the pack
// of the up half F elements further on, all arithmetic in fp32 and one rounding per output.
#include <cuda_runtime.h>

#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;

unsigned grid_of(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ float sigmoid_of(float g) {
  return 1.0f / (1.0f + __expf(-g));
}

// y[r, j] = silu(x[r, j]) * x[r, f + j] for kVec consecutive j per thread.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t f) {
  const int64_t per_row = f / kVec, work = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < work;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / per_row, j = (i - r * per_row) * kVec;
    const T* gate = x + r * 2 * f + j;
    float g[kVec], u[kVec], out[kVec];
    load_floats<kVec>(gate, g);
    load_floats<kVec>(gate + f, u);
#pragma unroll
    for (int v = 0; v < kVec; ++v) out[v] = g[v] * sigmoid_of(g[v]) * u[v];
    store_floats<kVec>(y + r * f + j, out);
  }
}

// dx[r, j] = dy * up * silu'(gate), dx[r, f + j] = dy * silu(gate), silu'(g) = s (1 + g (1 - s)).
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                           int64_t rows, int64_t f) {
  const int64_t per_row = f / kVec, work = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < work;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t r = i / per_row, j = (i - r * per_row) * kVec;
    const T* gate = x + r * 2 * f + j;
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    load_floats<kVec>(gate, g);
    load_floats<kVec>(gate + f, u);
    load_floats<kVec>(dy + r * f + j, d);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const float s = sigmoid_of(g[v]);
      du[v] = d[v] * g[v] * s;
      dg[v] = d[v] * u[v] * s * (1.0f + g[v] * (1.0f - s));
    }
    store_floats<kVec>(dx + r * 2 * f + j, dg);
    store_floats<kVec>(dx + r * 2 * f + f + j, du);
  }
}

}  // namespace

void launch_swiglu_forward(const void* x, void* y, int64_t rows, int64_t f, DType dtype,
                           cudaStream_t stream) {
  if (rows <= 0 || f <= 0) return;
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    constexpr int kVec = Pack<T>::kVec;
    const auto* in = static_cast<const T*>(x);
    auto* out = static_cast<T*>(y);
    if (f % kVec == 0 && aligned16(x) && aligned16(y))
      swiglu_forward_kernel<T, kVec>
          <<<grid_of(rows * (f / kVec)), kThreads, 0, stream>>>(in, out, rows, f);
    else
      swiglu_forward_kernel<T, 1><<<grid_of(rows * f), kThreads, 0, stream>>>(in, out, rows, f);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_swiglu_backward(const void* dy, const void* x, void* dx, int64_t rows, int64_t f,
                            DType dtype, cudaStream_t stream) {
  if (rows <= 0 || f <= 0) return;
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    constexpr int kVec = Pack<T>::kVec;
    const auto* g = static_cast<const T*>(dy);
    const auto* in = static_cast<const T*>(x);
    auto* out = static_cast<T*>(dx);
    if (f % kVec == 0 && aligned16(dy) && aligned16(x) && aligned16(dx))
      swiglu_backward_kernel<T, kVec>
          <<<grid_of(rows * (f / kVec)), kThreads, 0, stream>>>(g, in, out, rows, f);
    else
      swiglu_backward_kernel<T, 1><<<grid_of(rows * f), kThreads, 0, stream>>>(g, in, out, rows, f);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
