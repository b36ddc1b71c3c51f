// The FP8 cast kernel (kernel_launch.h for the contract, ops/fp8.h for the formulas). The ATen
// composition of the same cast reads x once for the scale, then writes and reads fp32 copies
// for the product and the clamp before the fp8 one, and launches several one-element kernels
// for the factor; here x is read once and only the fp8 bytes are written. A block takes a
// 32 x 32 tile: its factors are computed once per tile from amax on the device (no host round
// trip), each element is read along the rows (coalesced), written row-major and/or kept in
// shared memory and written transposed, coalesced along the transposed rows.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // the block: 32 x 8 threads, 4 rows of the tile each
constexpr int64_t kMaxBlocks = 1 << 20;

struct Cast {
  double max_finite;  // 448 or 57344
  double headroom;    // 2^margin
  bool power_of_2;
  __nv_fp8_interpretation_t kind;
};

// max / (max(amax, 1e-12) · 2^margin) in float64, then fp32, as ops/fp8.cpp's composition (and
// torchao) compute it; a NaN amax stays NaN.
template <typename T>
__device__ float factor_of(const T* amax, int64_t i, const Cast& c) {
  double a = static_cast<double>(to_float(amax[i]));
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

template <typename T>
__global__ void __launch_bounds__(kTile* kRowsPerPass)
    fp8_cast_kernel(const T* __restrict__ x, const T* __restrict__ amax, int64_t rows, int64_t cols,
                    int scale_axis, Cast c, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                    float* __restrict__ scale_out) {
  // +4: a column of the tile read by a warp then falls into 32 different banks.
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ float factor[kTile];
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = tiles_c * ((rows + kTile - 1) / kTile);
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
    if (ty == 0) {
      // The tile's factors: one (per tensor), its 32 rows' or its 32 columns'; each written out
      // as a scale by the tiles of the first column (rows) or the first row (columns).
      const int64_t i = scale_axis == 1 ? r0 + tx : scale_axis == 2 ? c0 + tx : 0;
      const int64_t n = scale_axis == 1 ? rows : scale_axis == 2 ? cols : 1;
      if (i < n && (scale_axis != 0 || tx == 0)) {
        const float q = factor_of(amax, i, c);
        factor[tx] = q;
        const bool writes = scale_axis == 1 ? c0 == 0 : scale_axis == 2 ? r0 == 0 : t == 0;
        if (writes) scale_out[i] = 1.0f / q;
      }
    }
    __syncthreads();
    const int64_t col = c0 + tx;
    for (int k = ty; k < kTile; k += kRowsPerPass) {
      const int64_t row = r0 + k;
      if (row < rows && col < cols) {
        const float q = factor[scale_axis == 1 ? k : scale_axis == 2 ? tx : 0];
        const uint8_t b = to_fp8(to_float(x[row * cols + col]) * q, c);
        if (out) out[row * cols + col] = b;
        tile[k][tx] = b;
      }
    }
    __syncthreads();
    if (out_t) {
      // Row k of the transposed tile: column c0 + k of x, its elements r0 + tx.
      for (int k = ty; k < kTile; k += kRowsPerPass) {
        const int64_t tcol = r0 + tx, trow = c0 + k;
        if (trow < cols && tcol < rows) out_t[trow * rows + tcol] = tile[tx][k];
      }
    }
    __syncthreads();  // the tile and the factors are the next tile's
  }
}

}  // namespace

void launch_fp8_cast(const void* x, const void* amax, int64_t rows, int64_t cols, DType dtype,
                     int scale_axis, Fp8Kind kind, int margin, bool power_of_2, void* out,
                     void* out_t, float* scale_out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (scale_axis < 0 || scale_axis > 2)
    throw Error("launch_fp8_cast: scale_axis must be 0, 1 or 2");
  const Cast c{kind == Fp8Kind::kE4M3 ? 448.0 : 57344.0, std::ldexp(1.0, margin), power_of_2,
               kind == Fp8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2};
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  const unsigned grid = static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
  const dim3 block(kTile, kRowsPerPass);
  dispatch(dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    fp8_cast_kernel<T><<<grid, block, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(amax), rows, cols, scale_axis, c,
        static_cast<uint8_t*>(out), static_cast<uint8_t*>(out_t), scale_out);
  });
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dscpp::ops::cuda
