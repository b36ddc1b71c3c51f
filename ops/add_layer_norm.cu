// The residual add + LayerNorm kernels: one block per row (grid-stride over rows). Forward
// reads x and the branch once from memory and writes h and y once; the statistics' two
// further passes over the row re-read h, which this thread has just written and which is still
// in the L2 cache (a row of hidden 8192 in fp32 is 32 KB), so memory traffic stays at four
// tensors. Backward reads dy, h, the weight and the incoming dh, reduces the row's two sums,
// writes dx, and adds dy * xhat and dy into its block's own row of fp32 partial sums of
// dweight and dbias (no atomics); a second kernel sums the blocks' rows in a fixed order.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Blocks of the backward, so rows of partial sums: enough to fill an H200's 132 SMs several
// times over, few enough that the final sum reads little (1024 x 2 x 8192 floats = 64 MB at
// most, 16 MB at hidden 2048).
constexpr int64_t kMaxBackwardBlocks = 1024;
constexpr int64_t kMaxGrid = 0x7fffffff;

// The sum of v over the block, returned to every thread. shared: kWarps floats, free on entry
// and on return. Fixed order, so deterministic.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = lane < kWarps ? shared[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) t += __shfl_xor_sync(0xffffffffu, t, offset);
  __syncthreads();
  return t;
}

// What rounding to T and back gives: the stored h is what the statistics see, as in eager
// (x + branch rounded to the dtype, then layer_norm of that).
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  return to_float(from_float<T>(v));
}

// kVec elements per pack: Pack<T>::kVec when every array is 16-byte aligned and n is a
// multiple of it, else 1 (scalar loads).
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    add_layer_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ branch,
                                  const T* __restrict__ weight, const T* __restrict__ bias, T* h,
                                  T* __restrict__ y, float* __restrict__ mean_out,
                                  float* __restrict__ rstd_out, int64_t rows, int64_t n,
                                  float eps) {
  __shared__ float shared[kWarps];
  const int64_t packs = n / kVec;
  const float inv_n = 1.0f / static_cast<float>(n);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * n;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float a[kVec], b[kVec];
      load_floats<kVec>(x + base + i * kVec, a);
      load_floats<kVec>(branch + base + i * kVec, b);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        a[k] = rounded<T>(a[k] + b[k]);
        sum += a[k];
      }
      store_floats<kVec>(h + base + i * kVec, a);
    }
    const float mean = block_sum(sum, shared) * inv_n;
    // The variance from the deviations (two passes), not E[h^2] - mean^2: no cancellation.
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float a[kVec];
      load_floats<kVec>(h + base + i * kVec, a);
#pragma unroll
      for (int k = 0; k < kVec; ++k) sq += (a[k] - mean) * (a[k] - mean);
    }
    const float rstd = rsqrtf(block_sum(sq, shared) * inv_n + eps);
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float a[kVec], w[kVec], b[kVec];
      load_floats<kVec>(h + base + i * kVec, a);
      load_floats<kVec>(weight + i * kVec, w);
      load_floats<kVec>(bias + i * kVec, b);
#pragma unroll
      for (int k = 0; k < kVec; ++k) a[k] = fmaf((a[k] - mean) * rstd, w[k], b[k]);
      store_floats<kVec>(y + base + i * kVec, a);
    }
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
}

// dx = dh + rstd * (dy * w - mean(dy * w) - xhat * mean(dy * w * xhat)), xhat = (h - mean) *
// rstd; partial[block][0][j] += dy * xhat, partial[block][1][j] += dy. dh may be null (zero).
// Every block has at least one row (grid <= rows), and a thread owns the same columns in every
// row it visits, so its partial sums need no synchronisation.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    add_layer_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ dh,
                                   const T* __restrict__ h, const T* __restrict__ weight,
                                   const float* __restrict__ mean_in,
                                   const float* __restrict__ rstd_in, T* __restrict__ dx,
                                   float* __restrict__ partial, int64_t rows, int64_t n) {
  __shared__ float shared[kWarps];
  const int64_t packs = n / kVec;
  const float inv_n = 1.0f / static_cast<float>(n);
  float* dweight_part = partial + static_cast<int64_t>(blockIdx.x) * 2 * n;
  float* dbias_part = dweight_part + n;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const bool first = row == blockIdx.x;
    const int64_t base = row * n;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float g[kVec], a[kVec], w[kVec];
      load_floats<kVec>(dy + base + i * kVec, g);
      load_floats<kVec>(h + base + i * kVec, a);
      load_floats<kVec>(weight + i * kVec, w);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xhat = (a[k] - mean) * rstd;
        const int64_t j = i * kVec + k;
        dweight_part[j] = first ? g[k] * xhat : fmaf(g[k], xhat, dweight_part[j]);
        dbias_part[j] = first ? g[k] : dbias_part[j] + g[k];
        sum_g += g[k] * w[k];
        sum_gx += g[k] * w[k] * xhat;
      }
    }
    const float mean_g = block_sum(sum_g, shared) * inv_n;
    const float mean_gx = block_sum(sum_gx, shared) * inv_n;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float g[kVec], a[kVec], w[kVec], r[kVec] = {};
      load_floats<kVec>(dy + base + i * kVec, g);
      load_floats<kVec>(h + base + i * kVec, a);
      load_floats<kVec>(weight + i * kVec, w);
      if (dh != nullptr) load_floats<kVec>(dh + base + i * kVec, r);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float xhat = (a[k] - mean) * rstd;
        r[k] += rstd * (g[k] * w[k] - mean_g - xhat * mean_gx);
      }
      store_floats<kVec>(dx + base + i * kVec, r);
    }
  }
}

// dweight[j] = sum over blocks of partial[b][0][j], dbias[j] of partial[b][1][j], rounded once
// to T; either output may be null. A block takes 32 columns (coalesced) and its 8 warps take
// every 8th block's row; the 8 sums then add in a fixed order (deterministic).
constexpr int kColumns = 32;
constexpr int kGroups = kThreads / kColumns;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    add_layer_norm_param_grad_kernel(const float* __restrict__ partial, int64_t blocks, int64_t n,
                                     T* __restrict__ dweight, T* __restrict__ dbias) {
  __shared__ float sums[2][kGroups][kColumns];
  const int col = threadIdx.x % kColumns, group = threadIdx.x / kColumns;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + col;
  float w = 0.0f, b = 0.0f;
  if (j < n) {
#pragma unroll 8
    for (int64_t blk = group; blk < blocks; blk += kGroups) {
      w += partial[blk * 2 * n + j];
      b += partial[blk * 2 * n + n + j];
    }
  }
  sums[0][group][col] = w;
  sums[1][group][col] = b;
  __syncthreads();
  if (group == 0 && j < n) {
    for (int g = 1; g < kGroups; ++g) {
      w += sums[0][g][col];
      b += sums[1][g][col];
    }
    if (dweight != nullptr) dweight[j] = from_float<T>(w);
    if (dbias != nullptr) dbias[j] = from_float<T>(b);
  }
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
}

template <typename T>
bool packed(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % Pack<T>::kVec != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

}  // namespace

int64_t add_layer_norm_backward_blocks(int64_t rows) {
  return rows < kMaxBackwardBlocks ? rows : kMaxBackwardBlocks;
}

void launch_add_layer_norm_forward(const void* x, const void* branch, const void* weight,
                                   const void* bias, void* h, void* y, float* mean, float* rstd,
                                   int64_t rows, int64_t n, float eps, DType dtype,
                                   cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    const auto* xp = static_cast<const T*>(x);
    const auto* bp = static_cast<const T*>(branch);
    const auto* wp = static_cast<const T*>(weight);
    const auto* cp = static_cast<const T*>(bias);
    auto* hp = static_cast<T*>(h);
    auto* yp = static_cast<T*>(y);
    if (packed<T>(n, {x, branch, weight, bias, h, y}))
      add_layer_norm_forward_kernel<T, Pack<T>::kVec><<<row_grid(rows), kThreads, 0, stream>>>(
          xp, bp, wp, cp, hp, yp, mean, rstd, rows, n, eps);
    else
      add_layer_norm_forward_kernel<T, 1><<<row_grid(rows), kThreads, 0, stream>>>(
          xp, bp, wp, cp, hp, yp, mean, rstd, rows, n, eps);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_add_layer_norm_backward(const void* dy, const void* dh, const void* h,
                                    const void* weight, const float* mean, const float* rstd,
                                    void* dx, void* dweight, void* dbias, float* workspace,
                                    int64_t rows, int64_t n, DType dtype, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  const int64_t blocks = add_layer_norm_backward_blocks(rows);
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    const auto* gp = static_cast<const T*>(dy);
    const auto* rp = static_cast<const T*>(dh);
    const auto* hp = static_cast<const T*>(h);
    const auto* wp = static_cast<const T*>(weight);
    auto* dxp = static_cast<T*>(dx);
    const auto grid = static_cast<unsigned>(blocks);
    if (packed<T>(n, {dy, dh, h, weight, dx}))
      add_layer_norm_backward_kernel<T, Pack<T>::kVec>
          <<<grid, kThreads, 0, stream>>>(gp, rp, hp, wp, mean, rstd, dxp, workspace, rows, n);
    else
      add_layer_norm_backward_kernel<T, 1>
          <<<grid, kThreads, 0, stream>>>(gp, rp, hp, wp, mean, rstd, dxp, workspace, rows, n);
    DSCPP_CUDA_CHECK(cudaGetLastError());
    if (dweight != nullptr || dbias != nullptr) {
      const auto cols = static_cast<unsigned>((n + kColumns - 1) / kColumns);
      add_layer_norm_param_grad_kernel<T><<<cols, kThreads, 0, stream>>>(
          workspace, blocks, n, static_cast<T*>(dweight), static_cast<T*>(dbias));
    }
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
