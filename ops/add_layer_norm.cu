// The residual add + LayerNorm kernels. Forward: one block per row (grid-stride over rows);
// reads x and the branch once from memory and writes h and y once; the statistics' two further
// passes over the row re-read h, which this thread has just written and which is still in the
// L2 cache, so memory traffic stays at four tensors. Backward (n <= kAddLayerNormBackwardMaxN):
// a block per row at a time, a row's elements in registers, reads dy, h, the weight and the
// incoming dh once, writes dx, and keeps dweight/dbias partial sums in registers over all its
// rows, written once per block; a second kernel sums the blocks' rows in a fixed order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
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

// The sums of a and b over the block (blockDim.x a multiple of 32, at most 1024), returned to
// every thread. shared: 64 floats, free on entry and on return. Fixed order: deterministic.
__device__ __forceinline__ void block_sum2(float& a, float& b, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = static_cast<int>(blockDim.x / 32);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  if (lane == 0) {
    shared[warp] = a;
    shared[32 + warp] = b;
  }
  __syncthreads();
  a = lane < warps ? shared[lane] : 0.0f;
  b = lane < warps ? shared[32 + lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  __syncthreads();
}

// Backward: each block takes every gridDim.x-th row; a thread owns the same kBackwardElems
// columns of every row (packs threadIdx.x + p * blockDim.x), so it keeps the row's dy * w, xhat
// and dh in registers between the row's two sums and dx, and its columns' dweight and dbias
// sums in registers over all the block's rows: written once per block, to its row of the
// [blocks, 2, n] fp32 workspace, then summed over blocks by a column kernel (Apex's
// cuComputePartGradGammaBeta + cuComputeGradGammaBeta, with the partial pass fused into dx's so
// dy and h are read once).
//
// Why this shape (GPT 1.3B, 8192 rows x hidden 2048, bf16): the backward must read dy, h and dh
// (3 x 33.5 MB) and write dx (33.5 MB): 134 MB, plus mean/rstd (64 KB), and the partial sums,
// 528 blocks x 2 x 2048 fp32 = 8.7 MB written and read back (mostly from L2): ~143 MB, about
// half of eager's 268 MB (layer_norm's input gradient 3 tensors, GammaBeta 2, the sum of h's two
// gradients 3), where a per-row read-modify-write of the partials in global memory took ~0.36 ms
// (docs/perf-log/2026-12-02.md). Measured: forward + backward 1.2-1.55x eager's
// (docs/performance.md, "Kernels").
constexpr int kBackwardElems = 8;  // of a row per thread: one 16-byte pack of bf16/fp16
constexpr int kBackwardMaxThreads = 1024;
// Resident threads per SM the grid aims at: 32 warps, what ~64 registers a thread allow.
constexpr int kBackwardThreadsPerSm = 1024;

// dx = dh + rstd * (dy * w - mean(dy * w) - xhat * mean(dy * w * xhat)), xhat = (h - mean) *
// rstd; partial[block][0][j] = sum of dy * xhat, partial[block][1][j] = sum of dy over the
// block's rows. dh may be null (zero). dy * w is rounded once (__fmul_rn, never contracted into
// an FMA) and that one value feeds both the row's sum and dx, so where the LayerNorm's gradient
// is 0 exactly (hidden 1: dy * w - mean(dy * w) = 0) dx is dh exactly, not rstd (up to 316)
// times an FMA's rounding difference.
template <typename T, int kVec>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    add_layer_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ dh,
                                   const T* __restrict__ h, const T* __restrict__ weight,
                                   const float* __restrict__ mean_in,
                                   const float* __restrict__ rstd_in, T* __restrict__ dx,
                                   float* __restrict__ partial, int64_t rows, int64_t n) {
  constexpr int kPacks = kBackwardElems / kVec;
  __shared__ float shared[64];
  const int64_t packs = n / kVec;
  const float inv_n = 1.0f / static_cast<float>(n);
  float acc_w[kPacks][kVec] = {}, acc_b[kPacks][kVec] = {};
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * n;
    const float mean = mean_in[row], rstd = rstd_in[row];
    float gw[kPacks][kVec] = {}, xhat[kPacks][kVec] = {}, r[kPacks][kVec] = {};
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
      if (i >= packs) continue;
      float g[kVec], a[kVec], w[kVec];
      load_floats<kVec>(dy + base + i * kVec, g);
      load_floats<kVec>(h + base + i * kVec, a);
      load_floats<kVec>(weight + i * kVec, w);
      if (dh != nullptr) load_floats<kVec>(dh + base + i * kVec, r[p]);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        xhat[p][k] = (a[k] - mean) * rstd;
        gw[p][k] = __fmul_rn(g[k], w[k]);
        sum_g += gw[p][k];
        sum_gx += gw[p][k] * xhat[p][k];
        acc_w[p][k] = fmaf(g[k], xhat[p][k], acc_w[p][k]);
        acc_b[p][k] += g[k];
      }
    }
    block_sum2(sum_g, sum_gx, shared);
    const float mean_g = sum_g * inv_n, mean_gx = sum_gx * inv_n;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
      if (i >= packs) continue;
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        r[p][k] += rstd * (__fsub_rn(gw[p][k], mean_g) - xhat[p][k] * mean_gx);
      store_floats<kVec>(dx + base + i * kVec, r[p]);
    }
  }
  float* dweight_part = partial + static_cast<int64_t>(blockIdx.x) * 2 * n;
  float* dbias_part = dweight_part + n;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (i >= packs) continue;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      dweight_part[i * kVec + k] = acc_w[p][k];
      dbias_part[i * kVec + k] = acc_b[p][k];
    }
  }
}

// dweight[j] = sum over blocks of partial[b][0][j], dbias[j] of partial[b][1][j], rounded once
// to T; either output may be null. A block takes 32 columns (coalesced) and its 32 warps take
// every 32nd block's row; the 32 sums then add in a fixed order (deterministic).
constexpr int kColumns = 32;
constexpr int kGroups = 32;
constexpr int kParamThreads = kColumns * kGroups;

template <typename T>
__global__ void __launch_bounds__(kParamThreads)
    add_layer_norm_param_grad_kernel(const float* __restrict__ partial, int64_t blocks, int64_t n,
                                     T* __restrict__ dweight, T* __restrict__ dbias) {
  __shared__ float sums[2][kGroups][kColumns];
  const int col = threadIdx.x % kColumns, group = threadIdx.x / kColumns;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + col;
  float w = 0.0f, b = 0.0f;
  if (j < n) {
#pragma unroll 4
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

// Threads of a backward block: kBackwardElems columns each, whole warps.
int backward_threads(int64_t n) {
  const int64_t threads = (n + kBackwardElems - 1) / kBackwardElems;
  return static_cast<int>((threads + 31) / 32 * 32);
}

int64_t backward_blocks(int64_t rows, int64_t n) {
  int device = 0, sms = 0;
  DSCPP_CUDA_CHECK(cudaGetDevice(&device));
  DSCPP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t per_sm = std::max(1, kBackwardThreadsPerSm / backward_threads(n));
  return std::min(rows, static_cast<int64_t>(sms) * per_sm);
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

int64_t add_layer_norm_backward_workspace(int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return 0;
  return backward_blocks(rows, n) * 2 * n;
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
  if (n > kAddLayerNormBackwardMaxN)
    throw Error("launch_add_layer_norm_backward: hidden size " + std::to_string(n) +
                " is above the kernel's " + std::to_string(kAddLayerNormBackwardMaxN) +
                " (wider rows take ATen's kernels)");
  const int64_t blocks = backward_blocks(rows, n);
  const auto threads = static_cast<unsigned>(backward_threads(n));
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    static_assert(kBackwardElems % Pack<T>::kVec == 0);
    const auto* gp = static_cast<const T*>(dy);
    const auto* rp = static_cast<const T*>(dh);
    const auto* hp = static_cast<const T*>(h);
    const auto* wp = static_cast<const T*>(weight);
    auto* dxp = static_cast<T*>(dx);
    const auto grid = static_cast<unsigned>(blocks);
    if (packed<T>(n, {dy, dh, h, weight, dx}))
      add_layer_norm_backward_kernel<T, Pack<T>::kVec>
          <<<grid, threads, 0, stream>>>(gp, rp, hp, wp, mean, rstd, dxp, workspace, rows, n);
    else
      add_layer_norm_backward_kernel<T, 1>
          <<<grid, threads, 0, stream>>>(gp, rp, hp, wp, mean, rstd, dxp, workspace, rows, n);
    DSCPP_CUDA_CHECK(cudaGetLastError());
    if (dweight != nullptr || dbias != nullptr) {
      const auto cols = static_cast<unsigned>((n + kColumns - 1) / kColumns);
      add_layer_norm_param_grad_kernel<T><<<cols, kParamThreads, 0, stream>>>(
          workspace, blocks, n, static_cast<T*>(dweight), static_cast<T*>(dbias));
    }
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
