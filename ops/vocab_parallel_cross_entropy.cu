// The vocabulary-parallel cross entropy's kernels, one block per row of this rank's logit
// shard [rows, part] (bf16/fp16/fp32 read as fp32): the row's local max; then, given the
// group's max, the local sum of exp(x - max) and the target's shifted logit where this shard
// owns it; backward writes (exp(x - max) / sum_exp - onehot) * grad into the shard in one pass.
// The reductions between them (MAX, then one SUM of both values) are the caller's.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxGrid = 0x7fffffff;

template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* shared, Op op, float init) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = lane < kWarps ? shared[lane] : init;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) t = op(t, __shfl_xor_sync(0xffffffffu, t, offset));
  __syncthreads();
  return t;
}

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    vp_max_kernel(const T* __restrict__ logits, int64_t rows, int64_t part,
                  float* __restrict__ row_max) {
  __shared__ float shared[kWarps];
  const int64_t packs = part / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = logits + row * part;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float v[kVec];
      load_floats<kVec>(p + i * kVec, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = fmaxf(m, v[k]);
    }
    m = block_reduce(m, shared, Max{}, -INFINITY);
    if (threadIdx.x == 0) row_max[row] = m;
  }
}

// sums[row] = sum of exp(x - max[row]); sums[rows + row] = x[target - start] - max[row] where
// start <= target < start + part, else 0.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    vp_sum_exp_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                      int64_t rows, int64_t part, int64_t start, const float* __restrict__ row_max,
                      float* __restrict__ sums) {
  __shared__ float shared[kWarps];
  const int64_t packs = part / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = logits + row * part;
    const float m = row_max[row];
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float v[kVec];
      load_floats<kVec>(p + i * kVec, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) s += expf(v[k] - m);
    }
    s = block_reduce(s, shared, Sum{}, 0.0f);
    if (threadIdx.x == 0) {
      const int64_t local = targets[row] - start;
      sums[row] = s;
      sums[rows + row] = local >= 0 && local < part ? to_float(p[local]) - m : 0.0f;
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    vp_backward_kernel(const float* __restrict__ grad, const T* __restrict__ logits,
                       const int64_t* __restrict__ targets, int64_t rows, int64_t part,
                       int64_t start, const float* __restrict__ row_max,
                       const float* __restrict__ sum_exp, T* __restrict__ dlogits) {
  const int64_t packs = part / kVec;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = logits + row * part;
    T* out = dlogits + row * part;
    const float m = row_max[row], inv = 1.0f / sum_exp[row], g = grad[row];
    const int64_t local = targets[row] - start;  // outside [0, part): not this shard's
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      float v[kVec];
      load_floats<kVec>(p + i * kVec, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float prob = expf(v[k] - m) * inv;
        v[k] = (i * kVec + k == local ? prob - 1.0f : prob) * g;
      }
      store_floats<kVec>(out + i * kVec, v);
    }
  }
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
}

template <typename T>
bool packed(int64_t part, const void* a, const void* b = nullptr) {
  return part % Pack<T>::kVec == 0 && aligned16(a) && (b == nullptr || aligned16(b));
}

}  // namespace

void launch_vocab_parallel_max(const void* logits, int64_t rows, int64_t part, DType dtype,
                               float* row_max, cudaStream_t stream) {
  if (rows <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* in = static_cast<const T*>(logits);
    if (packed<T>(part, logits))
      vp_max_kernel<T, Pack<T>::kVec>
          <<<row_grid(rows), kThreads, 0, stream>>>(in, rows, part, row_max);
    else
      vp_max_kernel<T, 1><<<row_grid(rows), kThreads, 0, stream>>>(in, rows, part, row_max);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_vocab_parallel_sum_exp(const void* logits, const int64_t* targets, int64_t rows,
                                   int64_t part, int64_t start, const float* row_max, DType dtype,
                                   float* sums, cudaStream_t stream) {
  if (rows <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* in = static_cast<const T*>(logits);
    if (packed<T>(part, logits))
      vp_sum_exp_kernel<T, Pack<T>::kVec>
          <<<row_grid(rows), kThreads, 0, stream>>>(in, targets, rows, part, start, row_max, sums);
    else
      vp_sum_exp_kernel<T, 1>
          <<<row_grid(rows), kThreads, 0, stream>>>(in, targets, rows, part, start, row_max, sums);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_vocab_parallel_backward(const float* grad, const void* logits, const int64_t* targets,
                                    int64_t rows, int64_t part, int64_t start, const float* row_max,
                                    const float* sum_exp, DType dtype, void* dlogits,
                                    cudaStream_t stream) {
  if (rows <= 0 || part <= 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* in = static_cast<const T*>(logits);
    auto* out = static_cast<T*>(dlogits);
    if (packed<T>(part, logits, dlogits))
      vp_backward_kernel<T, Pack<T>::kVec><<<row_grid(rows), kThreads, 0, stream>>>(
          grad, in, targets, rows, part, start, row_max, sum_exp, out);
    else
      vp_backward_kernel<T, 1><<<row_grid(rows), kThreads, 0, stream>>>(
          grad, in, targets, rows, part, start, row_max, sum_exp, out);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
