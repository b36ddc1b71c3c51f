// The cross-entropy kernels: one block per row of logits. Forward reads the row once, each
// thread keeping a running max and a sum of exponentials scaled to it (the online softmax, in
// base 2 so each element costs one FMA and one exp2), and the block combines the threads'
// pairs; a one-block kernel then adds the rows' losses in a fixed order (deterministic).
// Backward reads the row once more and writes (softmax - onehot) * grad / count.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // packs whose loads a thread has in flight at once
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int64_t kMaxGrid = 0x7fffffff;

// A running softmax denominator in base 2: the sum of 2^(y - m) over the values seen, where
// y = x * log2(e) and m is the largest such y. m = -inf (and s = 0) until a finite value comes.
struct MaxSum {
  float m;
  float s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // exp2f(-inf - -inf) would be NaN
  return {m, a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m)};
}

// Adds kVec values to acc. A NaN value makes the sum NaN (fmaxf alone would drop it).
template <int kVec>
__device__ __forceinline__ void accumulate(MaxSum& acc, const float (&v)[kVec]) {
  float local = v[0];
#pragma unroll
  for (int k = 1; k < kVec; ++k) local = fmaxf(local, v[k]);
  const float m = fmaxf(acc.m, local * kLog2e);
  if (m == -INFINITY) return;  // only -inf so far: nothing to add
  // The max rarely moves after a row's first packs, so the rescale is rarely taken.
  if (m != acc.m) acc.s *= exp2f(acc.m - m);
  acc.m = m;
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) sum += exp2f(fmaf(v[k], kLog2e, -m));
  acc.s += sum;
}

// The elements of a row split into [0, head) and [head + kVec * packs, vocab), read one by
// one, and packs of kVec from head, 16-byte aligned. kVec 1: no head, every element a pack.
template <typename T, int kVec>
struct RowSplit {
  int64_t head;
  int64_t packs;
  __device__ RowSplit(const T* row, int64_t vocab) {
    if constexpr (kVec == 1) {
      head = 0;
      packs = vocab;
    } else {
      const auto mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) % 16);
      head = mis == 0 ? 0 : (16 - mis) / static_cast<int64_t>(sizeof(T));
      if (head > vocab) head = vocab;
      packs = (vocab - head) / kVec;
    }
  }
  // The j-th element outside the packs, for j < vocab - kVec * packs.
  __device__ int64_t loose(int64_t j) const { return j < head ? j : j + kVec * packs; }
};

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                 int64_t rows, int64_t vocab, int64_t ignore_index,
                                 float* __restrict__ lse, float* __restrict__ row_loss) {
  __shared__ MaxSum warp_acc[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t target = targets[row];
    if (target == ignore_index) {  // the same for the whole block: no divergence
      if (threadIdx.x == 0) lse[row] = row_loss[row] = 0.0f;
      continue;
    }
    const T* p = logits + row * vocab;
    // Issued first so that its latency hides behind the row's loads.
    float target_logit = NAN;
    if (threadIdx.x == 0 && target >= 0 && target < vocab) target_logit = to_float(p[target]);

    const RowSplit<T, kVec> split(p, vocab);
    const T* body = p + split.head;
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t i = threadIdx.x; i < split.packs; i += kThreads * kUnroll) {
      float v[kUnroll][kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i + u * kThreads < split.packs)
          load_floats<kVec>(body + (i + u * kThreads) * kVec, v[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i + u * kThreads < split.packs) accumulate<kVec>(acc, v[u]);
    }
    const int64_t loose = vocab - kVec * split.packs;
    for (int64_t j = threadIdx.x; j < loose; j += kThreads) {
      const float v[1] = {to_float(p[split.loose(j)])};
      accumulate<1>(acc, v);
    }

    // The block's pairs: within each warp by shuffles, then warp 0 over the warps' results.
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset),
                         __shfl_xor_sync(0xffffffffu, acc.s, offset)};
      acc = combine(acc, other);
    }
    if (lane == 0) warp_acc[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = lane < kWarps ? warp_acc[lane] : MaxSum{-INFINITY, 0.0f};
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        const MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset),
                           __shfl_xor_sync(0xffffffffu, acc.s, offset)};
        acc = combine(acc, other);
      }
      if (lane == 0) {
        const float l = (acc.m + log2f(acc.s)) * kLn2;
        lse[row] = l;
        row_loss[row] = l - target_logit;
      }
    }
    __syncthreads();  // warp_acc is reused by the next row
  }
}

// loss = sum(row_loss) / count over counted rows, summed in double in a fixed order.
constexpr int kMeanThreads = 1024;

__global__ void __launch_bounds__(kMeanThreads)
    cross_entropy_mean_kernel(const float* __restrict__ row_loss,
                              const int64_t* __restrict__ targets, int64_t rows,
                              int64_t ignore_index, float* __restrict__ loss,
                              float* __restrict__ count) {
  __shared__ double sums[kMeanThreads];
  __shared__ long long counts[kMeanThreads];
  double sum = 0.0;
  long long counted = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kMeanThreads) {
    sum += row_loss[i];  // 0 for ignored rows
    counted += targets[i] != ignore_index ? 1 : 0;
  }
  sums[threadIdx.x] = sum;
  counts[threadIdx.x] = counted;
  __syncthreads();
  for (int half = kMeanThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    count[0] = static_cast<float>(counts[0]);
    loss[0] = static_cast<float>(sums[0] / static_cast<double>(counts[0]));  // 0 / 0: NaN
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const float* __restrict__ grad, const T* __restrict__ logits,
                                  const int64_t* __restrict__ targets,
                                  const float* __restrict__ lse, const float* __restrict__ count,
                                  int64_t rows, int64_t vocab, int64_t ignore_index,
                                  T* __restrict__ dlogits) {
  // Only read for counted rows, so count is not 0 where it is used.
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t target = targets[row];
    const bool ignored = target == ignore_index;  // uniform across the block
    const float scale = ignored ? 0.0f : grad[0] / count[0];
    const float lse2 = ignored ? 0.0f : lse[row] * kLog2e;
    const T* in = logits + row * vocab;
    T* out = dlogits + row * vocab;
    // dlogits and logits share their offset from a 16-byte boundary (the launch checks), so
    // one split serves both.
    const RowSplit<T, kVec> split(in, vocab);
    const auto grad_of = [&](float x, int64_t j) {
      if (ignored) return 0.0f;
      const float p = exp2f(fmaf(x, kLog2e, -lse2));
      return (j == target ? p - 1.0f : p) * scale;
    };
    for (int64_t i = threadIdx.x; i < split.packs; i += kThreads * kUnroll) {
      float v[kUnroll][kVec] = {};  // stays 0 for an ignored row, which reads nothing
      if (!ignored) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (i + u * kThreads < split.packs)
            load_floats<kVec>(in + split.head + (i + u * kThreads) * kVec, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t pack = i + u * kThreads;
        if (pack < split.packs) {
          const int64_t j0 = split.head + pack * kVec;
#pragma unroll
          for (int k = 0; k < kVec; ++k) v[u][k] = grad_of(v[u][k], j0 + k);
          store_floats<kVec>(out + j0, v[u]);
        }
      }
    }
    const int64_t loose = vocab - kVec * split.packs;
    for (int64_t j = threadIdx.x; j < loose; j += kThreads) {
      const int64_t e = split.loose(j);
      out[e] = from_float<T>(grad_of(ignored ? 0.0f : to_float(in[e]), e));
    }
  }
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
}

}  // namespace

void launch_cross_entropy_forward(const void* logits, const int64_t* targets, int64_t rows,
                                  int64_t vocab, int64_t ignore_index, DType dtype, float* lse,
                                  float* row_loss, float* loss, float* count, cudaStream_t stream) {
  if (rows > 0) {
    // Every row is split at its own 16-byte boundary, so the packed kernel always applies.
    dispatch(dtype, [&](auto type_tag) {
      using T = decltype(type_tag);
      cross_entropy_forward_kernel<T, Pack<T>::kVec><<<row_grid(rows), kThreads, 0, stream>>>(
          static_cast<const T*>(logits), targets, rows, vocab, ignore_index, lse, row_loss);
    });
    DSCPP_CUDA_CHECK(cudaGetLastError());
  }
  // No rows: count 0 and loss NaN, as torch's mean over nothing.
  cross_entropy_mean_kernel<<<1, kMeanThreads, 0, stream>>>(row_loss, targets, rows, ignore_index,
                                                            loss, count);
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_cross_entropy_backward(const float* grad, const void* logits, const int64_t* targets,
                                   const float* lse, const float* count, int64_t rows,
                                   int64_t vocab, int64_t ignore_index, DType dtype, void* dlogits,
                                   cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return;
  const bool same_offset =
      reinterpret_cast<uintptr_t>(logits) % 16 == reinterpret_cast<uintptr_t>(dlogits) % 16;
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    const auto* in = static_cast<const T*>(logits);
    auto* out = static_cast<T*>(dlogits);
    if (same_offset)
      cross_entropy_backward_kernel<T, Pack<T>::kVec><<<row_grid(rows), kThreads, 0, stream>>>(
          grad, in, targets, lse, count, rows, vocab, ignore_index, out);
    else
      cross_entropy_backward_kernel<T, 1><<<row_grid(rows), kThreads, 0, stream>>>(
          grad, in, targets, lse, count, rows, vocab, ignore_index, out);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
