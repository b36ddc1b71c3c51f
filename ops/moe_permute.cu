// The MoE permutation kernels (kernel_launch.h; moe_permute.h for the contract). Routing to rows
// takes three small kernels over the S * k routes, cut into chunks of kChunk consecutive routes,
// one block each: count (each chunk's histogram of experts), scan (one block: every chunk's
// first row for each expert), place (each route's row: its chunk's first row for its expert
// plus the routes of that expert before it in the chunk). Nothing returns to the host, and
// the order is the ATen path's stable sort. The row kernels give one warp to each row: a copy
// (gather), a weighted sum over a token's k rows (combine: the unpermute, and the permute's
// backward), and the unpermute's backward with its per-route dot products.
#include <cuda_runtime.h>

#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTiles = 4;                      // tiles of kThreads routes in a chunk
constexpr int64_t kChunk = kThreads * kTiles;  // routes per block of count and place
constexpr int kScanThreads = 1024;             // the scan's one block
constexpr int64_t kMaxExperts = 1024;          // moe_permute.h's kMoePermuteMaxExperts
constexpr int64_t kMaxGrid = 0x7fffffff;

int64_t chunks_of(int64_t routes) {
  return (routes + kChunk - 1) / kChunk;
}

unsigned warp_grid(int64_t rows) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

// Route r's expert, or -1 when it is not routed (dropped, out of range, past the end).
__device__ __forceinline__ int route_expert(const int64_t* __restrict__ indices,
                                            const bool* __restrict__ kept, int64_t r,
                                            int64_t routes, int experts) {
  if (r >= routes || !kept[r]) return -1;
  const int64_t e = indices[r];
  return e >= 0 && e < experts ? static_cast<int>(e) : -1;
}

__global__ void __launch_bounds__(kThreads)
    moe_count_kernel(const int64_t* __restrict__ indices, const bool* __restrict__ kept,
                     int64_t routes, int experts, int* __restrict__ chunk_counts) {
  extern __shared__ int hist[];  // [experts]
  for (int e = threadIdx.x; e < experts; e += kThreads) hist[e] = 0;
  __syncthreads();
  const int64_t begin = blockIdx.x * kChunk;
  for (int t = 0; t < kTiles; ++t) {
    const int e = route_expert(indices, kept, begin + t * kThreads + threadIdx.x, routes, experts);
    if (e >= 0) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kThreads)
    chunk_counts[blockIdx.x * experts + e] = hist[e];
}

// chunk_counts [chunks, experts] in, each chunk's first row for each expert out; counts[e].
__global__ void __launch_bounds__(kScanThreads)
    moe_scan_kernel(int* __restrict__ chunk_counts, int64_t chunks, int experts,
                    int64_t* __restrict__ counts) {
  extern __shared__ int first[];  // [experts]: the expert's first row
  for (int e = threadIdx.x; e < experts; e += kScanThreads) {
    int run = 0;  // down the column of expert e: consecutive threads read consecutive words
    for (int64_t b = 0; b < chunks; ++b) {
      const int c = chunk_counts[b * experts + e];
      chunk_counts[b * experts + e] = run;
      run += c;
    }
    first[e] = run;
    counts[e] = run;
  }
  __syncthreads();
  // At most 1024 experts: one thread's serial scan is a few microseconds, below a launch.
  if (threadIdx.x == 0) {
    int run = 0;
    for (int e = 0; e < experts; ++e) {
      const int c = first[e];
      first[e] = run;
      run += c;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kScanThreads)
    for (int64_t b = 0; b < chunks; ++b) chunk_counts[b * experts + e] += first[e];
}

// Each route's row. Per tile of kThreads routes: a lane's rank among the lanes of its warp with
// the same expert (__match_any_sync), plus the counts of earlier warps of the tile, plus the
// running row of the expert in this chunk: the stable order within the chunk.
__global__ void __launch_bounds__(kThreads)
    moe_place_kernel(const int64_t* __restrict__ indices, const bool* __restrict__ kept,
                     int64_t routes, int experts, const int* __restrict__ chunk_first,
                     int64_t* __restrict__ route_dest, int64_t* __restrict__ row_route) {
  extern __shared__ int smem[];
  int* running = smem;               // [experts]: the next row of each expert
  int* warp_count = smem + experts;  // [kWarps][experts]: this tile's routes per warp
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    running[e] = chunk_first[blockIdx.x * experts + e];
    for (int w = 0; w < kWarps; ++w) warp_count[w * experts + e] = 0;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t begin = blockIdx.x * kChunk;
  for (int t = 0; t < kTiles; ++t) {
    const int64_t r = begin + t * kThreads + threadIdx.x;
    const int e = route_expert(indices, kept, r, routes, experts);
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0) warp_count[warp * experts + e] = __popc(peers);
    __syncthreads();
    if (e >= 0) {
      int dest = running[e] + rank;
      for (int w = 0; w < warp; ++w) dest += warp_count[w * experts + e];
      route_dest[r] = dest;
      row_route[dest] = r;
    } else if (r < routes) {
      route_dest[r] = -1;
    }
    __syncthreads();
    for (int x = threadIdx.x; x < experts; x += kThreads) {
      int add = 0;
      for (int w = 0; w < kWarps; ++w) {
        add += warp_count[w * experts + x];
        warp_count[w * experts + x] = 0;
      }
      running[x] += add;
    }
    __syncthreads();
  }
}

// One warp per row: out[r] = tokens[row_route[r] / k], as words of V (16-byte words when the
// rows allow it).
template <typename V>
__global__ void __launch_bounds__(kThreads)
    moe_gather_kernel(const V* __restrict__ tokens, const int64_t* __restrict__ row_route,
                      int64_t rows, int64_t words, int64_t k, V* __restrict__ out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t r = blockIdx.x * int64_t{kWarps} + warp; r < rows;
       r += int64_t{gridDim.x} * kWarps) {
    const int64_t route = row_route[r];  // the same for the whole warp
    V* dst = out + r * words;
    if (route < 0) {
      for (int64_t i = lane; i < words; i += 32) dst[i] = V{};
      continue;
    }
    const V* src = tokens + (route / k) * words;
    for (int64_t i = lane; i < words; i += 32) dst[i] = src[i];
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    moe_combine_kernel(const T* __restrict__ in, const float* __restrict__ weights,
                       const int64_t* __restrict__ route_dest, int64_t in_rows, int64_t tokens,
                       int64_t hidden, int64_t k, T* __restrict__ out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t packs = hidden / kVec;
  for (int64_t s = blockIdx.x * int64_t{kWarps} + warp; s < tokens;
       s += int64_t{gridDim.x} * kWarps) {
    const int64_t* dest = route_dest + s * k;
    for (int64_t p = lane; p < packs; p += 32) {
      float acc[kVec] = {};
      // In choice order, the same for every element: the sum's order is fixed (deterministic).
      for (int64_t j = 0; j < k; ++j) {
        const int64_t d = dest[j];
        if (d < 0 || d >= in_rows) continue;
        const float w = weights ? weights[s * k + j] : 1.0f;
        float v[kVec];
        load_floats<kVec>(in + d * hidden + p * kVec, v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] = fmaf(w, v[i], acc[i]);
      }
      store_floats<kVec>(out + s * hidden + p * kVec, acc);
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    moe_unpermute_backward_kernel(const T* __restrict__ grad, const T* __restrict__ expert_rows,
                                  const float* __restrict__ weights,
                                  const int64_t* __restrict__ row_route, int64_t rows,
                                  int64_t hidden, int64_t k, T* __restrict__ d_rows,
                                  float* __restrict__ d_weights) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t packs = hidden / kVec;
  for (int64_t r = blockIdx.x * int64_t{kWarps} + warp; r < rows;
       r += int64_t{gridDim.x} * kWarps) {
    const int64_t route = row_route[r];  // the same for the whole warp
    T* dr = d_rows + r * hidden;
    if (route < 0) {
      const float zero[kVec] = {};
      for (int64_t p = lane; p < packs; p += 32) store_floats<kVec>(dr + p * kVec, zero);
      continue;
    }
    const float w = weights[route];
    const T* g = grad + (route / k) * hidden;
    const T* y = expert_rows + r * hidden;
    float dot = 0.0f;
    for (int64_t p = lane; p < packs; p += 32) {
      float gv[kVec], out[kVec];
      load_floats<kVec>(g + p * kVec, gv);
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = w * gv[i];
      store_floats<kVec>(dr + p * kVec, out);
      if (d_weights) {
        float yv[kVec];
        load_floats<kVec>(y + p * kVec, yv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot = fmaf(gv[i], yv[i], dot);
      }
    }
    if (d_weights) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2)
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (lane == 0) d_weights[route] = dot;
    }
  }
}

template <typename V>
void gather_as(const void* tokens, const int64_t* row_route, int64_t rows, int64_t words, int64_t k,
               void* out, cudaStream_t stream) {
  moe_gather_kernel<V><<<warp_grid(rows), kThreads, 0, stream>>>(
      static_cast<const V*>(tokens), row_route, rows, words, k, static_cast<V*>(out));
}

}  // namespace

int64_t moe_permute_workspace(int64_t routes, int64_t experts) {
  return chunks_of(routes) * experts;
}

void launch_moe_permute_routes(const int64_t* indices, const bool* kept, int64_t routes,
                               int64_t experts, int* workspace, int64_t* counts,
                               int64_t* route_dest, int64_t* row_route, cudaStream_t stream) {
  if (experts < 1 || experts > kMaxExperts)
    throw Error("launch_moe_permute_routes: experts must be in [1, 1024], got " +
                std::to_string(experts));
  if (routes >= kMaxGrid)
    throw Error("launch_moe_permute_routes: at most 2^31 - 1 routes, got " +
                std::to_string(routes));
  const int e = static_cast<int>(experts);
  const int64_t chunks = chunks_of(routes);
  const size_t ints = sizeof(int) * static_cast<size_t>(experts);
  if (chunks > 0) {
    moe_count_kernel<<<static_cast<unsigned>(chunks), kThreads, ints, stream>>>(
        indices, kept, routes, e, workspace);
    DSCPP_CUDA_CHECK(cudaGetLastError());
  }
  // Also with no routes: the counts are then zeros.
  moe_scan_kernel<<<1, kScanThreads, ints, stream>>>(workspace, chunks, e, counts);
  DSCPP_CUDA_CHECK(cudaGetLastError());
  if (chunks > 0) {
    moe_place_kernel<<<static_cast<unsigned>(chunks), kThreads, ints*(1 + kWarps), stream>>>(
        indices, kept, routes, e, workspace, route_dest, row_route);
    DSCPP_CUDA_CHECK(cudaGetLastError());
  }
}

void launch_moe_gather_rows(const void* tokens, const int64_t* row_route, int64_t rows,
                            int64_t hidden, int64_t k, int64_t element_size, void* out,
                            cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return;
  const int64_t bytes = hidden * element_size;
  if (bytes % 16 == 0 && aligned16(tokens) && aligned16(out))
    gather_as<uint4>(tokens, row_route, rows, bytes / 16, k, out, stream);
  else if (element_size == 4)
    gather_as<uint32_t>(tokens, row_route, rows, hidden, k, out, stream);
  else if (element_size == 2)
    gather_as<uint16_t>(tokens, row_route, rows, hidden, k, out, stream);
  else
    throw Error("launch_moe_gather_rows: elements of " + std::to_string(element_size) +
                " bytes (2 or 4 expected)");
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_combine(const void* in, const float* weights, const int64_t* route_dest,
                        int64_t in_rows, int64_t tokens, int64_t hidden, int64_t k, DType dtype,
                        void* out, cudaStream_t stream) {
  if (tokens <= 0 || hidden <= 0) return;
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    const auto* x = static_cast<const T*>(in);
    auto* y = static_cast<T*>(out);
    if (hidden % Pack<T>::kVec == 0 && aligned16(in) && aligned16(out))
      moe_combine_kernel<T, Pack<T>::kVec><<<warp_grid(tokens), kThreads, 0, stream>>>(
          x, weights, route_dest, in_rows, tokens, hidden, k, y);
    else
      moe_combine_kernel<T, 1><<<warp_grid(tokens), kThreads, 0, stream>>>(
          x, weights, route_dest, in_rows, tokens, hidden, k, y);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_unpermute_backward(const void* grad, const void* expert_rows, const float* weights,
                                   const int64_t* row_route, int64_t rows, int64_t hidden,
                                   int64_t k, DType dtype, void* d_rows, float* d_weights,
                                   cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return;
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    const auto* g = static_cast<const T*>(grad);
    const auto* y = static_cast<const T*>(expert_rows);
    auto* d = static_cast<T*>(d_rows);
    if (hidden % Pack<T>::kVec == 0 && aligned16(grad) && aligned16(expert_rows) &&
        aligned16(d_rows))
      moe_unpermute_backward_kernel<T, Pack<T>::kVec><<<warp_grid(rows), kThreads, 0, stream>>>(
          g, y, weights, row_route, rows, hidden, k, d, d_weights);
    else
      moe_unpermute_backward_kernel<T, 1><<<warp_grid(rows), kThreads, 0, stream>>>(
          g, y, weights, row_route, rows, hidden, k, d, d_weights);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
