// The FP8 cast kernel (kernel_launch.h for the contract, ops/fp8.h for the formulas). The ATen
// composition of the same cast reads x once for the scale, then writes and reads fp32 copies
// for the product and the clamp before the fp8 one, and launches several one-element kernels
// for the factor; here x is read once and only the fp8 bytes are written. A block takes a
// 64 x 64 tile: its factors are computed once per tile from amax on the device (no host round
// trip). Where the tile is whole and the shapes allow it, each thread reads 8 elements in 16-byte
// loads, writes their 8 fp8 bytes in one store, and writes the transposed tile from shared
// memory 16 bytes at a time; a tile at the edge, or a shape that does not allow the wide
// accesses, goes element by element. A tensor's one amax comes from fp8_amax_kernel (16-byte
// loads, one atomic a block), where ATen's generic reduction ran at about half the card's
// bandwidth, 7.6% of an FP8 step (perf-log 2026-12-07 P). The first version took one element a
// thread and a byte a store: 105 µs a cast on average, a quarter of an FP8 step (perf-log
// 2026-12-07 M).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kTile = 64;  // a tile: 64 x 64 elements
constexpr int kThreads = 256;
constexpr int kWide = 8;  // the elements a thread reads at once on the wide path
// The shared tile's row stride in bytes: 66 puts the transposed gather's four 16-row bands
// (16 · 66 / 4 = 264 words apart) on banks 8 apart, so that a warp's reads do not collide.
constexpr int kStride = kTile + 2;
constexpr int64_t kMaxBlocks = 1 << 20;

struct Cast {
  double max_finite;  // 448 or 57344
  double headroom;    // 2^margin
  bool power_of_2;
  bool factor_given;  // `amax` holds the factors themselves
  __nv_fp8_interpretation_t kind;
};

// max / (max(amax, 1e-12) · 2^margin) in float64, then fp32, as ops/fp8.cpp's composition (and
// torchao) compute it; a NaN amax stays NaN.
__device__ float factor_of(const float* amax, int64_t i, const Cast& c) {
  if (c.factor_given) return amax[i];
  double a = static_cast<double>(amax[i]);
  if (a < 1e-12) a = 1e-12;
  float q = static_cast<float>(c.max_finite / (a * c.headroom));
  if (c.power_of_2) q = exp2f(floorf(log2f(q)));
  return q;
}

// fp8(clamp(v, ±max)), NaN kept (fminf and fmaxf would turn it into the bound).
__device__ __forceinline__ uint8_t to_fp8(float v, const Cast& c) {
  const float m = static_cast<float>(c.max_finite);
  if (!isnan(v)) v = fminf(fmaxf(v, -m), m);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, c.kind));
}

// 8 consecutive elements at p (16-byte aligned) as floats: one 16-byte load for 16-bit types,
// two for fp32.
template <typename T>
__device__ __forceinline__ void load_wide(const T* p, float (&v)[kWide]) {
  constexpr int kPer = Pack<T>::kVec;
#pragma unroll
  for (int h = 0; h < kWide; h += kPer) {
    const Pack<T> pk = load_pack(p + h);
#pragma unroll
    for (int e = 0; e < kPer; ++e) v[h + e] = to_float(pk.v[e]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_kernel(const T* __restrict__ x, const float* __restrict__ amax, int64_t rows,
                    int64_t cols, int scale_axis, Cast c, bool wide, uint8_t* __restrict__ out,
                    uint8_t* __restrict__ out_t, float* __restrict__ scale_out) {
  __shared__ uint8_t tile[kTile][kStride];
  __shared__ float factor[kTile];
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = tiles_c * ((rows + kTile - 1) / kTile);
  const int tid = threadIdx.x;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
    if (tid < kTile) {
      // The tile's factors: one (per tensor), its 64 rows' or its 64 columns'; each written out
      // as a scale by the tiles of the first column (rows) or the first row (columns).
      const int64_t i = scale_axis == 1 ? r0 + tid : scale_axis == 2 ? c0 + tid : 0;
      const int64_t n = scale_axis == 1 ? rows : scale_axis == 2 ? cols : 1;
      if (i < n && (scale_axis != 0 || tid == 0)) {
        const float q = factor_of(amax, i, c);
        factor[tid] = q;
        const bool writes = scale_axis == 1 ? c0 == 0 : scale_axis == 2 ? r0 == 0 : t == 0;
        if (writes) scale_out[i] = 1.0f / q;
      }
    }
    __syncthreads();
    const bool whole = wide && r0 + kTile <= rows && c0 + kTile <= cols;
    if (whole) {
      // 64 rows of 8 packs: a warp reads 4 rows' 64 elements each, contiguous.
      for (int g = tid; g < kTile * kTile / kWide; g += kThreads) {
        const int k = g / (kTile / kWide), j0 = g % (kTile / kWide) * kWide;
        const int64_t at = (r0 + k) * cols + c0 + j0;
        float v[kWide];
        load_wide(x + at, v);
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int e = 0; e < kWide; ++e) {
          const float q = factor[scale_axis == 1 ? k : scale_axis == 2 ? j0 + e : 0];
          const uint32_t b = to_fp8(v[e] * q, c);
          tile[k][j0 + e] = static_cast<uint8_t>(b);
          if (e < 4)
            lo |= b << (8 * e);
          else
            hi |= b << (8 * (e - 4));
        }
        if (out) *reinterpret_cast<uint2*>(out + at) = make_uint2(lo, hi);
      }
      __syncthreads();
      if (out_t) {
        // 64 transposed rows of 64 bytes, 4 threads a row, 16 bytes each: the gather reads
        // column j of the tile from rows 16s..16s+15.
        for (int g = tid; g < kTile * kTile / 16; g += kThreads) {
          const int j = g / 4, s = g % 4;
          uint32_t w[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int r = 16 * s + 4 * q;
            w[q] = static_cast<uint32_t>(tile[r][j]) | static_cast<uint32_t>(tile[r + 1][j]) << 8 |
                   static_cast<uint32_t>(tile[r + 2][j]) << 16 |
                   static_cast<uint32_t>(tile[r + 3][j]) << 24;
          }
          *reinterpret_cast<uint4*>(out_t + (c0 + j) * rows + r0 + 16 * s) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    } else {
      for (int e = tid; e < kTile * kTile; e += kThreads) {
        const int k = e / kTile, j = e % kTile;
        const int64_t row = r0 + k, col = c0 + j;
        if (row < rows && col < cols) {
          const float q = factor[scale_axis == 1 ? k : scale_axis == 2 ? j : 0];
          const uint8_t b = to_fp8(to_float(x[row * cols + col]) * q, c);
          if (out) out[row * cols + col] = b;
          tile[k][j] = b;
        }
      }
      __syncthreads();
      if (out_t) {
        // Transposed row j: column c0 + j of x, its elements r0 + k.
        for (int e = tid; e < kTile * kTile; e += kThreads) {
          const int j = e / kTile, k = e % kTile;
          const int64_t trow = c0 + j, tcol = r0 + k;
          if (trow < cols && tcol < rows) out_t[trow * rows + tcol] = tile[k][j];
        }
      }
    }
    __syncthreads();  // the tile and the factors are the next tile's
  }
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The larger of two absolute values, NaN winning (fmaxf would drop it).
__device__ __forceinline__ float max_nan(float a, float b) {
  return isnan(a) || a > b ? a : b;
}

// |x|'s maximum into *amax (zeroed before): each thread over 16-byte packs (grid-stride), then
// the warp and the block, then one atomicMax a block on the float's bits, which order as the
// values do for non-negative floats, a NaN (sign cleared by fabsf) above infinity.
template <typename T, bool kWideLoads>
__global__ void __launch_bounds__(kThreads)
    fp8_amax_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ amax) {
  __shared__ float warp_max[kThreads / 32];
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  int64_t tail = 0;
  if constexpr (kWideLoads) {
    constexpr int kPer = Pack<T>::kVec;
    const int64_t packs = n / kPer;
    for (int64_t i = first; i < packs; i += stride) {
      const Pack<T> pk = load_pack(x + i * kPer);
#pragma unroll
      for (int e = 0; e < kPer; ++e) m = max_nan(fabsf(to_float(pk.v[e])), m);
    }
    tail = packs * kPer;
  }
  for (int64_t i = tail + first; i < n; i += stride) m = max_nan(fabsf(to_float(x[i])), m);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = max_nan(__shfl_xor_sync(0xffffffffu, m, o), m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = max_nan(warp_max[w], m);
    atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
  }
}

}  // namespace

void launch_fp8_cast(const void* x, const float* amax, bool factor_given, int64_t rows,
                     int64_t cols, DType dtype, int scale_axis, Fp8Kind kind, int margin,
                     bool power_of_2, void* out, void* out_t, float* scale_out,
                     cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (scale_axis < 0 || scale_axis > 2)
    throw Error("launch_fp8_cast: scale_axis must be 0, 1 or 2");
  const Cast c{kind == Fp8Kind::kE4M3 ? 448.0 : 57344.0, std::ldexp(1.0, margin), power_of_2,
               factor_given, kind == Fp8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2};
  // The wide path's accesses: 16-byte loads of x's rows, 8-byte stores of out's, 16-byte
  // stores of out_t's (its rows are x's columns, `rows` bytes long).
  const bool wide = cols % kWide == 0 && rows % 16 == 0 && aligned(x, 16) &&
                    (!out || aligned(out, 8)) && (!out_t || aligned(out_t, 16));
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  const unsigned grid = static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    fp8_cast_kernel<T><<<grid, kThreads, 0, stream>>>(
        static_cast<const T*>(x), amax, rows, cols, scale_axis, c, wide, static_cast<uint8_t*>(out),
        static_cast<uint8_t*>(out_t), scale_out);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

void launch_fp8_amax(const void* x, int64_t n, DType dtype, float* amax, cudaStream_t stream) {
  DSCPP_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n <= 0) return;
  // Enough blocks to keep every SM's loads in flight (8 a multiprocessor), no more: each block
  // ends in one atomic.
  int device = 0, sms = 0;
  DSCPP_CUDA_CHECK(cudaGetDevice(&device));
  DSCPP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t wanted = (n + 8 * kThreads - 1) / (8 * kThreads);
  const unsigned grid = static_cast<unsigned>(wanted < 8 * sms ? wanted : 8 * sms);
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    if (aligned(x, 16))
      fp8_amax_kernel<T, true><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), n, amax);
    else
      fp8_amax_kernel<T, false><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), n, amax);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
