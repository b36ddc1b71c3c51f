// The fused Adam/AdamW kernel: one grid-stride pass, vector loads and stores over the part
// of the shard where all four arrays are aligned for four elements, scalar code for the rest.
#include <cstdint>

#include "dscpp/ops/cuda_common.cuh"
#include "dscpp/ops/fused_adam_kernel.h"

namespace dscpp::ops::cuda {
namespace {

// The error check (DSCPP_CUDA_CHECK) and the element conversions are ops' (one copy of each).
using ops::cuda::from_float;
using ops::cuda::to_float;

constexpr int kThreads = 256;

// torch's ops, one at a time, in float: p.mul_(decay) or g = g + l2*p; m.lerp_(g, w);
// v.mul_(b2).addcmul_(g, g, 1-b2); denom = sqrt(v) / bc2_sqrt + eps; p.addcdiv_(m, denom, -step).
__device__ __forceinline__ void adam_element(float& p, float g, float& m, float& v,
                                             const FusedAdamScalars& s) {
  if (s.decoupled)
    p = p * s.decay;
  else
    g = g + s.l2 * p;
  const float w = s.one_minus_b1;
  m = w < 0.5f ? m + w * (g - m) : g - (g - m) * (1.0f - w);  // at::lerp's two branches
  v = v * s.beta2;
  v = v + s.one_minus_b2 * g * g;
  const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  p = p + s.neg_step * m / denom;
}

// Four gradient elements from an address aligned for four, as floats.
__device__ __forceinline__ float4 load4(const float* g) {
  return __ldg(reinterpret_cast<const float4*>(g));
}
template <typename G>
__device__ __forceinline__ float4 load4(const G* g) {  // 16-bit: four elements in 8 bytes
  const uint2 raw = __ldg(reinterpret_cast<const uint2*>(g));
  const G* e = reinterpret_cast<const G*>(&raw);
  return make_float4(to_float(e[0]), to_float(e[1]), to_float(e[2]), to_float(e[3]));
}

// Four 16-bit copies of updated parameters to an address aligned for four, in 8 bytes.
template <typename C>
__device__ __forceinline__ void store4(C* q, const float4& x) {
  uint2 raw;
  C* e = reinterpret_cast<C*>(&raw);
  e[0] = from_float<C>(x.x);
  e[1] = from_float<C>(x.y);
  e[2] = from_float<C>(x.z);
  e[3] = from_float<C>(x.w);
  *reinterpret_cast<uint2*>(q) = raw;
}

// Elements [head, head + 4*nvec) go four at a time (all arrays aligned for four elements
// there); the rest, [0, head) and [head + 4*nvec, n), one at a time. q (may be null): the
// updated parameters' 16-bit copy, written from the registers, so that ZeRO's publication
// needs no second pass re-reading the fp32 parameters.
template <typename G, typename C>
__global__ void __launch_bounds__(kThreads)
    fused_adam_kernel(float* __restrict__ p, const G* __restrict__ g, float* __restrict__ m,
                      float* __restrict__ v, C* __restrict__ q, int64_t n, int64_t head,
                      int64_t nvec, FusedAdamScalars s, const float* __restrict__ grad_scale) {
  // g * scale rounds once, as the separate multiply it replaces did: __fmul_rn, which the
  // compiler never contracts into an fma with what follows (it did for 16-bit gradients).
  const float gs = grad_scale ? __ldg(grad_scale) : 1.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!isfinite(gs)) {  // an overflow's verdict, decided on the device: no update
    if (q)
      for (int64_t j = tid; j < n; j += stride) q[j] = from_float<C>(p[j]);
    return;
  }
  float4* p4 = reinterpret_cast<float4*>(p + head);
  float4* m4 = reinterpret_cast<float4*>(m + head);
  float4* v4 = reinterpret_cast<float4*>(v + head);
  for (int64_t i = tid; i < nvec; i += stride) {
    float4 pp = p4[i];
    const float4 gg = load4(g + head + 4 * i);
    float4 mm = m4[i];
    float4 vv = v4[i];
    adam_element(pp.x, __fmul_rn(gg.x, gs), mm.x, vv.x, s);
    adam_element(pp.y, __fmul_rn(gg.y, gs), mm.y, vv.y, s);
    adam_element(pp.z, __fmul_rn(gg.z, gs), mm.z, vv.z, s);
    adam_element(pp.w, __fmul_rn(gg.w, gs), mm.w, vv.w, s);
    p4[i] = pp;
    m4[i] = mm;
    v4[i] = vv;
    if (q) store4(q + head + 4 * i, pp);
  }
  const int64_t body = 4 * nvec;
  const int64_t rest = n - body;
  for (int64_t i = tid; i < rest; i += stride) {
    const int64_t j = i < head ? i : i + body;
    float pj = p[j], mj = m[j], vj = v[j];
    adam_element(pj, __fmul_rn(to_float(g[j]), gs), mj, vj, s);
    p[j] = pj;
    m[j] = mj;
    v[j] = vj;
    if (q) q[j] = from_float<C>(pj);
  }
}

template <typename G, typename C>
void launch_typed(float* p, const G* g, float* m, float* v, C* q, int64_t n,
                  const FusedAdamScalars& s, const float* grad_scale, cudaStream_t stream) {
  // Vectorise when the four arrays sit at the same element offset from a four-element
  // boundary: a scalar head brings them to it, a scalar tail ends the body.
  const auto element_misalign = [](const void* ptr, size_t size) -> int64_t {
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    if (address % size != 0) return -1;
    return static_cast<int64_t>(address % (4 * size) / size);
  };
  const int64_t off = element_misalign(p, sizeof(float));
  int64_t head = n, nvec = 0;
  if (off >= 0 && element_misalign(g, sizeof(G)) == off &&
      element_misalign(m, sizeof(float)) == off && element_misalign(v, sizeof(float)) == off &&
      (q == nullptr || element_misalign(q, sizeof(C)) == off)) {
    head = off == 0 ? 0 : 4 - off;
    if (head > n) head = n;
    nvec = (n - head) / 4;
  }
  const int64_t work = nvec + (n - 4 * nvec);  // iterations of the longer loop at most
  int device = 0, sms = 0, per_sm = 0;
  DSCPP_CUDA_CHECK(cudaGetDevice(&device));
  DSCPP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  DSCPP_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_adam_kernel<G, C>, kThreads, 0));
  // One full wave of resident blocks (no half-empty last wave); the grid-stride loop does
  // the rest. (Other grids measured no clear gain: docs/perf-log/2026-11-30.md, "The Adam grid".)
  const int64_t max_blocks =
      static_cast<int64_t>(sms > 0 ? sms : 1) * static_cast<int64_t>(per_sm > 0 ? per_sm : 1);
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  fused_adam_kernel<G, C><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      p, g, m, v, q, n, head, nvec, s, grad_scale);
  DSCPP_CUDA_CHECK(cudaGetLastError());
}

template <typename G>
void launch_copy_typed(float* p, const G* g, float* m, float* v, int64_t n,
                       const FusedAdamScalars& s, const float* grad_scale, void* copy,
                       CopyType copy_type, cudaStream_t stream) {
  if (copy_type == CopyType::kHalf)
    return launch_typed(p, g, m, v, static_cast<__half*>(copy), n, s, grad_scale, stream);
  launch_typed(p, g, m, v, static_cast<__nv_bfloat16*>(copy), n, s, grad_scale, stream);
}

}  // namespace

void launch_fused_adam(float* p, const void* g, GradType g_type, float* m, float* v, int64_t n,
                       const FusedAdamScalars& s, const float* grad_scale, void* copy,
                       CopyType copy_type, cudaStream_t stream) {
  if (n <= 0) return;
  switch (g_type) {
    case GradType::kFloat:
      return launch_copy_typed(p, static_cast<const float*>(g), m, v, n, s, grad_scale, copy,
                               copy_type, stream);
    case GradType::kBFloat16:
      return launch_copy_typed(p, static_cast<const __nv_bfloat16*>(g), m, v, n, s, grad_scale,
                               copy, copy_type, stream);
    case GradType::kHalf:
      return launch_copy_typed(p, static_cast<const __half*>(g), m, v, n, s, grad_scale, copy,
                               copy_type, stream);
  }
}

}  // namespace dscpp::ops::cuda
