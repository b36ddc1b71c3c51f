// What the kernels of ops share: the CUDA error check (cuda_check.h), fp32 conversions of the
// element types, 16-byte packs, and the DType -> C++ type dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dscpp/error.h"
#include "dscpp/ops/cuda_check.h"
#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {

// All arithmetic is in fp32; these are the only conversions (round to nearest even on store).
__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// kVec elements of T in 16 bytes: one 128-bit load or store (ld.global.v4) per pack.
template <typename T>
struct Pack {
  static constexpr int kVec = 16 / sizeof(T);
  T v[kVec];
};

// p must be 16-byte aligned. The uint4 goes through memcpy so no type-punned access remains
// once the compiler has turned both into one vector register move.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  Pack<T> out;
  memcpy(&out, &raw, sizeof(raw));
  return out;
}

template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& in) {
  uint4 raw;
  memcpy(&raw, &in, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}

// kVec consecutive elements at p as floats: one 16-byte load when kVec fills a Pack (p then
// 16-byte aligned), kVec scalar loads otherwise (kVec 1: the unaligned fallback).
template <int kVec, typename T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[kVec]) {
  if constexpr (kVec == Pack<T>::kVec) {
    const Pack<T> pk = load_pack(p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = to_float(pk.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = to_float(p[k]);
  }
}

template <int kVec, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[kVec]) {
  if constexpr (kVec == Pack<T>::kVec) {
    Pack<T> pk;
#pragma unroll
    for (int k = 0; k < kVec; ++k) pk.v[k] = from_float<T>(in[k]);
    store_pack(p, pk);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) p[k] = from_float<T>(in[k]);
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Calls f with a value of the C++ element type of dtype (f's argument picks the template).
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      return;
    case DType::kFloat16:
      f(__half{});
      return;
    case DType::kBFloat16:
      f(__nv_bfloat16{});
      return;
  }
  throw Error("dscpp kernels: unknown DType");
}

}  // namespace dscpp::ops::cuda
