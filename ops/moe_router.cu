// The MoE router's top-k kernels (kernel_launch.h; moe_router.h for the contract). One warp
// per token: the token's selection scores go to the warp's slice of shared memory, then k
// rounds of a warp-wide arg-max (each lane's best over its experts, then five shuffles), the
// chosen expert marked taken; lane j keeps choice j, so the weights' sum and the backward's dot
// product are warp sums too. Nothing returns to the host.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxExperts = 1024;  // moe_router.h's kMoeTopKMaxExperts
constexpr int64_t kMaxK = 32;          // moe_router.h's kMoeTopKMaxK
constexpr int64_t kMaxGrid = 0x7fffffff;

unsigned warp_grid(int64_t tokens) {
  const int64_t blocks = (tokens + kWarps - 1) / kWarps;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// (value, expert) a beats b: larger value, or equal and lower expert; an expert of -1 (none
// yet) loses to any other. NaN counts as +inf (as torch.topk puts NaN first), so that the
// order is total and the butterfly leaves every lane with the same winner.
__device__ __forceinline__ bool beats(float av, int ae, float bv, int be) {
  if (be < 0) return ae >= 0;
  if (ae < 0) return false;
  av = isnan(av) ? INFINITY : av;
  bv = isnan(bv) ? INFINITY : bv;
  return av > bv || (av == bv && ae < be);
}

__global__ void __launch_bounds__(kThreads)
    moe_topk_forward_kernel(const float* __restrict__ scores, const float* __restrict__ bias,
                            int64_t tokens, int experts, int k, bool normalize, float scale,
                            int64_t* __restrict__ indices, float* __restrict__ weights,
                            unsigned long long* __restrict__ counts) {
  extern __shared__ float smem[];  // [kWarps][experts] selection scores, then as many flags
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* sel = smem + warp * experts;
  bool* taken = reinterpret_cast<bool*>(smem + kWarps * experts) + warp * experts;
  for (int64_t s = blockIdx.x * int64_t{kWarps} + warp; s < tokens;
       s += int64_t{gridDim.x} * kWarps) {
    const float* row = scores + s * experts;
    for (int e = lane; e < experts; e += 32) {
      sel[e] = row[e] + (bias ? bias[e] : 0.0f);
      taken[e] = false;
    }
    __syncwarp();
    int mine = -1;  // lane j keeps choice j
    for (int j = 0; j < k; ++j) {
      float best = 0.0f;
      int arg = -1;
      for (int e = lane; e < experts; e += 32)
        if (!taken[e] && beats(sel[e], e, best, arg)) {
          best = sel[e];
          arg = e;
        }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, offset);
        const int oe = __shfl_xor_sync(0xffffffffu, arg, offset);
        if (beats(ov, oe, best, arg)) {
          best = ov;
          arg = oe;
        }
      }
      // Every lane holds the same arg: k <= experts leaves one not taken.
      if (lane == j) mine = arg;
      if (lane == 0) taken[arg] = true;
      __syncwarp();
    }
    const float w = lane < k ? row[mine] : 0.0f;
    const float total = warp_sum(w);
    if (lane < k) {
      indices[s * k + lane] = mine;
      weights[s * k + lane] = (normalize ? w / fmaxf(total, FLT_EPSILON) : w) * scale;
      atomicAdd(counts + mine, 1ull);
    }
    __syncwarp();
  }
}

__global__ void __launch_bounds__(kThreads)
    moe_topk_backward_kernel(const float* __restrict__ grad, const float* __restrict__ scores,
                             const int64_t* __restrict__ indices, int64_t tokens, int experts,
                             int k, bool normalize, float scale, float* __restrict__ d_scores) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t s = blockIdx.x * int64_t{kWarps} + warp; s < tokens;
       s += int64_t{gridDim.x} * kWarps) {
    float* d = d_scores + s * experts;
    for (int e = lane; e < experts; e += 32) d[e] = 0.0f;
    const int64_t e = lane < k ? indices[s * k + lane] : 0;
    const float sv = lane < k ? scores[s * experts + e] : 0.0f;
    const float g = lane < k ? grad[s * k + lane] : 0.0f;
    float ds = scale * g;
    if (normalize) {
      const float total = warp_sum(sv);
      const float dot = warp_sum(g * sv);  // sum_i g_i s_i
      ds = total >= FLT_EPSILON ? scale * (g - dot / total) / total : scale * g / FLT_EPSILON;
    }
    __syncwarp();  // the zeros before the chosen entries
    if (lane < k) d[e] = ds;
    __syncwarp();
  }
}

}  // namespace

void launch_moe_topk_forward(const float* scores, const float* bias, int64_t tokens,
                             int64_t experts, int64_t k, bool normalize, float scale,
                             int64_t* indices, float* weights, int64_t* counts,
                             cudaStream_t stream) {
  if (experts < 1 || experts > kMaxExperts || k < 1 || k > kMaxK || k > experts)
    throw Error(
        "launch_moe_topk_forward: expected 1 <= k <= min(32, experts) and experts <= "
        "1024, got k = " +
        std::to_string(k) + ", experts = " + std::to_string(experts));
  if (tokens <= 0) return;
  const size_t smem = (sizeof(float) + sizeof(bool)) * static_cast<size_t>(experts) * kWarps;
  static_assert(sizeof(unsigned long long) == sizeof(int64_t), "counts are 64-bit");
  moe_topk_forward_kernel<<<warp_grid(tokens), kThreads, smem, stream>>>(
      scores, bias, tokens, static_cast<int>(experts), static_cast<int>(k), normalize, scale,
      indices, weights, reinterpret_cast<unsigned long long*>(counts));
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_topk_backward(const float* grad, const float* scores, const int64_t* indices,
                              int64_t tokens, int64_t experts, int64_t k, bool normalize,
                              float scale, float* d_scores, cudaStream_t stream) {
  if (experts < 1 || k < 1 || k > kMaxK || k > experts)
    throw Error("launch_moe_topk_backward: expected 1 <= k <= min(32, experts), got k = " +
                std::to_string(k) + ", experts = " + std::to_string(experts));
  if (tokens <= 0) return;
  moe_topk_backward_kernel<<<warp_grid(tokens), kThreads, 0, stream>>>(
      grad, scores, indices, tokens, static_cast<int>(experts), static_cast<int>(k), normalize,
      scale, d_scores);
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
