// The bias + GeLU kernels. A block owns a strip of columns (one 16-byte pack of x per thread,
// or one element on the fallback path) and a set of rows; each thread keeps its columns' bias
// in registers for all its rows and, in backward, sums its columns' dx over them in fp32, so
// dbias needs no atomics: the per-block partial sums are added by a second, small kernel, in a
// fixed order (the result does not depend on scheduling).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // rows whose loads a thread has in flight at once
// The grid is one wave of resident blocks (2048 threads an SM on sm_90); more rows loop.
constexpr int kBlocksPerSm = 2048 / kThreads;
constexpr int64_t kMaxGridY = 65535;

// tanh from one exp2 and one reciprocal (MUFU) instead of tanhf's longer sequence: the
// backward does ~30 fp32 operations an element, close to what bf16 bandwidth leaves room for.
// Its absolute error (~1e-7) is relative to the 1 that gelu adds to it. exp2f overflowing to
// inf gives 1, underflowing to 0 gives -1.
__device__ __forceinline__ float fast_tanh(float x) {
  constexpr float kTwoLog2e = 2.8853900817779268f;  // 2 / ln 2
  return 1.0f - __fdividef(2.0f, 1.0f + exp2f(x * kTwoLog2e));
}

// PyTorch's GeluCUDAKernelImpl / GeluBackwardCUDAKernelImpl formulas, in fp32.
template <bool kTanh>
__device__ __forceinline__ float gelu(float z) {
  if constexpr (kTanh) {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    const float inner = kBeta * (z + kKappa * z * z * z);
    return 0.5f * z * (1.0f + fast_tanh(inner));
  } else {
    constexpr float kAlpha = 0.7071067811865476f;  // 1 / sqrt(2)
    return z * 0.5f * (1.0f + erff(z * kAlpha));
  }
}

template <bool kTanh>
__device__ __forceinline__ float gelu_grad(float z) {
  if constexpr (kTanh) {
    constexpr float kBeta = 0.7978845608028654f;
    constexpr float kKappa = 0.044715f;
    const float z_sq = z * z;
    const float t = fast_tanh(kBeta * (z + kKappa * z_sq * z));
    const float left = 0.5f * z;
    const float right = 1.0f + t;
    return 0.5f * right + left * (1.0f - t * t) * (kBeta * (1.0f + 3.0f * kKappa * z_sq));
  } else {
    constexpr float kAlpha = 0.7071067811865476f;
    constexpr float kBeta = 0.3989422804014327f;  // 1 / sqrt(2 pi)
    const float cdf = 0.5f * (1.0f + erff(z * kAlpha));
    const float pdf = expf(-0.5f * z * z) * kBeta;
    return cdf + z * pdf;
  }
}

// Column unit u of a row covers elements [u * kVec, (u + 1) * kVec).
template <typename T, bool kTanh, int kVec>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                             int64_t rows, int64_t n) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  if (col >= n) return;
  float b[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) b[k] = to_float(bias[col + k]);  // any alignment: once
  const int64_t step = gridDim.y;
  for (int64_t r0 = blockIdx.y; r0 < rows; r0 += step * kUnroll) {
    float v[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * step;
      if (r < rows) load_floats<kVec>(x + r * n + col, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * step;
      if (r < rows) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[u][k] = gelu<kTanh>(v[u][k] + b[k]);
        store_floats<kVec>(y + r * n + col, v[u]);
      }
    }
  }
}

// partial[blockIdx.y * n + j]: this block's rows' sum of dx[., j] (when partial is not null).
template <typename T, bool kTanh, int kVec>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_backward_kernel(const T* __restrict__ grad, const T* __restrict__ x,
                              const T* __restrict__ bias, T* __restrict__ dx,
                              float* __restrict__ partial, int64_t rows, int64_t n) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kVec;
  if (col >= n) return;
  float b[kVec], acc[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    b[k] = to_float(bias[col + k]);
    acc[k] = 0.0f;
  }
  const int64_t step = gridDim.y;
  for (int64_t r0 = blockIdx.y; r0 < rows; r0 += step * kUnroll) {
    float g[kUnroll][kVec], v[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * step;
      if (r < rows) {
        load_floats<kVec>(grad + r * n + col, g[u]);
        load_floats<kVec>(x + r * n + col, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + u * step;
      if (r < rows) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          v[u][k] = g[u][k] * gelu_grad<kTanh>(v[u][k] + b[k]);
          acc[k] += v[u][k];
        }
        if (dx != nullptr) store_floats<kVec>(dx + r * n + col, v[u]);
      }
    }
  }
  if (partial != nullptr) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) partial[blockIdx.y * n + col + k] = acc[k];
  }
}

// dbias[j] = sum of partial[c * n + j] over c < chunks. Block (32, 8): a warp reads 32
// adjacent columns (coalesced), the 8 warps split the chunks, shared memory adds the 8.
constexpr int kReduceCols = 32;
constexpr int kReduceSplit = 8;

template <typename T>
__global__ void __launch_bounds__(kReduceCols* kReduceSplit)
    bias_grad_reduce_kernel(const float* __restrict__ partial, T* __restrict__ dbias,
                            int64_t chunks, int64_t n) {
  __shared__ float sums[kReduceSplit][kReduceCols];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kReduceCols + threadIdx.x;
  float acc = 0.0f;
  if (j < n) {
    for (int64_t c = threadIdx.y; c < chunks; c += kReduceSplit) acc += partial[c * n + j];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float total = 0.0f;
#pragma unroll
    for (int s = 0; s < kReduceSplit; ++s) total += sums[s][threadIdx.x];
    dbias[j] = from_float<T>(total);
  }
}

int sm_count() {
  int device = 0, sms = 0;
  DSCPP_CUDA_CHECK(cudaGetDevice(&device));
  DSCPP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms > 0 ? sms : 1;
}

int64_t vec_of(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : 8;
}

// Threads of a block cover kThreads column units; a strip is one block's columns.
int64_t strips(int64_t n, int64_t vec) {
  const int64_t units = (n + vec - 1) / vec;
  return (units + kThreads - 1) / kThreads;
}

// Row sets (gridDim.y): enough blocks for one wave of the packed kernels, each row set no
// smaller than one row. The same figure sizes dbias's workspace, so it depends only on the
// shape and dtype, not on which path (packed or scalar) a launch takes.
int64_t row_sets(int64_t rows, int64_t n, DType dtype) {
  const int64_t wave = static_cast<int64_t>(sm_count()) * kBlocksPerSm;
  const int64_t s = strips(n, vec_of(dtype));
  return std::max<int64_t>(1, std::min({rows, kMaxGridY, (wave + s - 1) / s}));
}

// The packed path reads a whole pack per thread: every row must start 16-byte aligned, so n is
// a multiple of the pack and each array's base is aligned.
bool packed(int64_t n, DType dtype, std::initializer_list<const void*> ptrs) {
  if (n % vec_of(dtype) != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

}  // namespace

void launch_bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t n,
                              DType dtype, bool tanh_approximation, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  const bool vec = packed(n, dtype, {x, y});
  const int64_t sets = row_sets(rows, n, dtype);
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    constexpr int kPack = Pack<T>::kVec;
    const dim3 grid(static_cast<unsigned>(strips(n, vec ? kPack : 1)), static_cast<unsigned>(sets));
    const auto* xt = static_cast<const T*>(x);
    const auto* bt = static_cast<const T*>(bias);
    auto* yt = static_cast<T*>(y);
    if (tanh_approximation) {
      if (vec)
        bias_gelu_forward_kernel<T, true, kPack>
            <<<grid, kThreads, 0, stream>>>(xt, bt, yt, rows, n);
      else
        bias_gelu_forward_kernel<T, true, 1><<<grid, kThreads, 0, stream>>>(xt, bt, yt, rows, n);
    } else {
      if (vec)
        bias_gelu_forward_kernel<T, false, kPack>
            <<<grid, kThreads, 0, stream>>>(xt, bt, yt, rows, n);
      else
        bias_gelu_forward_kernel<T, false, 1><<<grid, kThreads, 0, stream>>>(xt, bt, yt, rows, n);
    }
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

int64_t bias_gelu_partial_rows(int64_t rows, int64_t n, DType dtype) {
  if (rows <= 0 || n <= 0) return 0;
  return row_sets(rows, n, dtype);
}

void launch_bias_gelu_backward(const void* grad, const void* x, const void* bias, void* dx,
                               void* dbias, float* workspace, int64_t rows, int64_t n, DType dtype,
                               bool tanh_approximation, cudaStream_t stream) {
  if (n <= 0 || (dx == nullptr && dbias == nullptr)) return;
  float* partial = dbias != nullptr ? workspace : nullptr;
  const bool vec = packed(n, dtype, {grad, x, dx});
  const int64_t sets = bias_gelu_partial_rows(rows, n, dtype);
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    constexpr int kPack = Pack<T>::kVec;
    const auto* gt = static_cast<const T*>(grad);
    const auto* xt = static_cast<const T*>(x);
    const auto* bt = static_cast<const T*>(bias);
    auto* dxt = static_cast<T*>(dx);
    if (rows > 0) {
      const dim3 grid(static_cast<unsigned>(strips(n, vec ? kPack : 1)),
                      static_cast<unsigned>(sets));
      if (tanh_approximation) {
        if (vec)
          bias_gelu_backward_kernel<T, true, kPack>
              <<<grid, kThreads, 0, stream>>>(gt, xt, bt, dxt, partial, rows, n);
        else
          bias_gelu_backward_kernel<T, true, 1>
              <<<grid, kThreads, 0, stream>>>(gt, xt, bt, dxt, partial, rows, n);
      } else {
        if (vec)
          bias_gelu_backward_kernel<T, false, kPack>
              <<<grid, kThreads, 0, stream>>>(gt, xt, bt, dxt, partial, rows, n);
        else
          bias_gelu_backward_kernel<T, false, 1>
              <<<grid, kThreads, 0, stream>>>(gt, xt, bt, dxt, partial, rows, n);
      }
      DSCPP_CUDA_CHECK(cudaGetLastError());
    }
    if (dbias != nullptr) {
      // No rows: zero chunks, so the reduction writes dbias = 0.
      const dim3 block(kReduceCols, kReduceSplit);
      const auto blocks = static_cast<unsigned>((n + kReduceCols - 1) / kReduceCols);
      bias_grad_reduce_kernel<T>
          <<<blocks, block, 0, stream>>>(partial, static_cast<T*>(dbias), sets, n);
      DSCPP_CUDA_CHECK(cudaGetLastError());
    }
  });
}

}  // namespace dscpp::ops::cuda
