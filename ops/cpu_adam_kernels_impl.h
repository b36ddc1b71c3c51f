// The bodies of the CPU optimizers' kernels (cpu_adam_kernels.h), compiled once per
// instruction set: the including unit is built with CPU_CAPABILITY (DEFAULT, AVX2, AVX512)
// and its CPU_CAPABILITY_<X> macro defined and its compiler flags, as ATen builds its own
// kernels, so at::vec::Vectorized<float> is 8 or 16 lanes there and the code lands in a
// namespace of that name (no two units define the same symbol).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/bit_cast.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "dscpp/ops/cpu_adam_kernels.h"

namespace dscpp::ops::cpu::kernels {
namespace CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
// Elements per tile: a 16-bit gradient is widened into an fp32 tile on the stack, and the
// tile's updated parameters are narrowed into the copy right after, while both are in L1.
constexpr int64_t kTile = 1024;

inline Vec load(const float* p, int64_t n) {
  return n == Vec::size() ? Vec::loadu(p) : Vec::loadu(p, n);
}
inline void store(float* p, const Vec& v, int64_t n) {
  if (n == Vec::size())
    v.store(p);
  else
    v.store(p, n);
}

// The per-element updates. Each op is built once per range from the step's scalars, so its
// vector constants live in registers: read through the Scalars reference inside the loop, every
// one of them was re-loaded and re-broadcast per vector, since the compiler cannot prove that the
// stores to the float arrays leave the Scalars alone (measured: 9 broadcasts, 3 flag tests and the
// arrays' pointers re-read per 8 elements on AVX2). The weight decay's variant is a template
// argument for the same reason. run() takes n <= Vec::size() elements, all of them through the
// same vector instructions (a partial vector at the end), so every element of a partition gets
// the same rounding whatever its position.
enum class Decay { kNone, kL2, kDecoupled };

template <Decay kDecay>
struct AdamOp {
  Vec grad_scale, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, bias_correction2,
      weight_decay;
  explicit AdamOp(const Scalars& s)
      : grad_scale(s.grad_scale),
        beta1(s.beta1),
        beta2(s.beta2),
        one_minus_beta1(s.one_minus_beta1),
        one_minus_beta2(s.one_minus_beta2),
        eps(s.eps),
        step_size(s.step_size),
        bias_correction2(s.bias_correction2),
        weight_decay(s.weight_decay) {}

  void run(float* p, const float* g_in, float* m_out, float* v_out, int64_t n) const {
    Vec g = load(g_in, n) * grad_scale;
    Vec p4 = load(p, n), m = load(m_out, n), v = load(v_out, n);
    if constexpr (kDecay == Decay::kL2) g = at::vec::fmadd(p4, weight_decay, g);
    m = m * beta1;
    m = at::vec::fmadd(g, one_minus_beta1, m);
    v = v * beta2;
    v = at::vec::fmadd(g * g, one_minus_beta2, v);
    Vec denom = at::vec::fmadd(v.sqrt(), bias_correction2, eps);
    Vec update = m / denom;
    // AdamW: p += (-lr * wd) * p, before the step, from the same p.
    if constexpr (kDecay == Decay::kDecoupled) p4 = at::vec::fmadd(p4, weight_decay, p4);
    p4 = at::vec::fmadd(update, step_size, p4);
    store(p, p4, n);
    store(m_out, m, n);
    store(v_out, v, n);
  }
};

template <Decay kDecay>
struct AdagradOp {
  Vec grad_scale, eps, step_size, weight_decay;
  explicit AdagradOp(const Scalars& s)
      : grad_scale(s.grad_scale),
        eps(s.eps),
        step_size(s.step_size),
        weight_decay(s.weight_decay) {}

  void run(float* p, const float* g_in, float* sum_out, float*, int64_t n) const {
    Vec g = load(g_in, n) * grad_scale;
    Vec p4 = load(p, n), sum = load(sum_out, n);
    if constexpr (kDecay == Decay::kL2) g = at::vec::fmadd(p4, weight_decay, g);
    sum = at::vec::fmadd(g, g, sum);
    Vec update = g / (sum.sqrt() + eps);
    p4 = at::vec::fmadd(update, step_size, p4);
    store(p, p4, n);
    store(sum_out, sum, n);
  }
};

// Lion's decay multiplies p by 1 - lr * wd, which is 1 without decay: fmadd(p, 1, step) rounds
// once, as p + step does, so one variant serves both.
struct LionOp {
  Vec grad_scale, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, weight_decay;
  explicit LionOp(const Scalars& s)
      : grad_scale(s.grad_scale),
        beta1(s.beta1),
        beta2(s.beta2),
        one_minus_beta1(s.one_minus_beta1),
        one_minus_beta2(s.one_minus_beta2),
        step_size(s.step_size),
        weight_decay(s.decay ? s.weight_decay : 1.0f) {}

  void run(float* p, const float* g_in, float* m_out, float*, int64_t n) const {
    Vec g = load(g_in, n) * grad_scale;
    Vec p4 = load(p, n), m = load(m_out, n);
    Vec c = at::vec::fmadd(g, one_minus_beta1, m * beta1);
    // -lr carrying c's sign flipped in (sign bit of c xor -lr), and 0 where c is 0.
    const Vec sign_bit(-0.0f);
    Vec step = ((c & sign_bit) ^ step_size) & (c != Vec(0.0f));
    p4 = at::vec::fmadd(p4, weight_decay, step);
    m = at::vec::fmadd(g, one_minus_beta2, m * beta2);
    store(p, p4, n);
    store(m_out, m, n);
  }
};

// A 16-bit gradient widened to fp32 (exact), a vector at a time: ATen's at::vec::convert from
// BFloat16 / Half to float is its generic scalar loop, which cost the bf16 path about a tenth
// of its time at 16 threads (docs/perf-log/2026-12-02.md, "The CPU Adam").
template <typename G>
void widen(const G* src, float* dst, int64_t n) {
  using VecG = at::vec::Vectorized<G>;
  int64_t i = 0;
  for (; i + VecG::size() <= n; i += VecG::size()) {
    auto [lo, hi] = at::vec::convert_to_float<G>(VecG::loadu(src + i));
    lo.store(dst + i);
    hi.store(dst + i + Vec::size());
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename Op, typename G, typename C>
void run_range(const Arrays& a, const Scalars& s, int64_t begin, int64_t end) {
  alignas(64) float wide[kTile];
  const Op op(s);
  // The arrays' pointers in locals, for the same reason as the op's constants.
  float* const param = a.param;
  float* const state0 = a.state0;
  float* const state1 = a.state1;
  const G* const grad = static_cast<const G*>(a.grad);
  constexpr int64_t kVec = Vec::size();
  for (int64_t t = begin; t < end; t += kTile) {
    const int64_t n = std::min(kTile, end - t);
    const float* g;
    if constexpr (std::is_same_v<G, float>) {
      g = grad + t;
    } else {
      widen(grad + t, wide, n);
      g = wide;
    }
    float* const p = param + t;
    float* const s0 = state0 + t;
    float* const s1 = state1 ? state1 + t : nullptr;
    int64_t i = 0;
    for (; i + kVec <= n; i += kVec) op.run(p + i, g + i, s0 + i, s1 ? s1 + i : nullptr, kVec);
    if (i < n) op.run(p + i, g + i, s0 + i, s1 ? s1 + i : nullptr, n - i);
    if constexpr (!std::is_void_v<C>) at::vec::convert(p, static_cast<C*>(a.copy) + t, n);
  }
}

template <typename Op, typename G>
void by_copy(const Arrays& a, const Scalars& s, int64_t begin, int64_t end) {
  switch (a.copy_type) {
    case Type::kNone:
      return run_range<Op, G, void>(a, s, begin, end);
    case Type::kFloat:
      return run_range<Op, G, float>(a, s, begin, end);
    case Type::kBFloat16:
      return run_range<Op, G, c10::BFloat16>(a, s, begin, end);
    case Type::kHalf:
      return run_range<Op, G, c10::Half>(a, s, begin, end);
  }
}

template <typename Op>
void by_grad(const Arrays& a, const Scalars& s, int64_t begin, int64_t end) {
  switch (a.grad_type) {
    case Type::kBFloat16:
      return by_copy<Op, c10::BFloat16>(a, s, begin, end);
    case Type::kHalf:
      return by_copy<Op, c10::Half>(a, s, begin, end);
    default:
      return by_copy<Op, float>(a, s, begin, end);
  }
}

void adam(const Arrays& a, const Scalars& s, int64_t begin, int64_t end) {
  if (!s.decay) return by_grad<AdamOp<Decay::kNone>>(a, s, begin, end);
  if (s.decoupled) return by_grad<AdamOp<Decay::kDecoupled>>(a, s, begin, end);
  by_grad<AdamOp<Decay::kL2>>(a, s, begin, end);
}

void adagrad(const Arrays& a, const Scalars& s, int64_t begin, int64_t end) {
  if (!s.decay) return by_grad<AdagradOp<Decay::kNone>>(a, s, begin, end);
  by_grad<AdagradOp<Decay::kL2>>(a, s, begin, end);
}

// Sum of squares: kLanes double accumulators, which this unit's flags vectorise (AVX-512: two
// 8-double registers per 16 elements). Compiled in ops/sum_of_squares.cpp's own unit, without
// -mavx2, the same loop runs SSE2's two doubles an instruction: 0.5-0.7 G elements/s a core,
// slower than the landings it has to keep up with (docs/perf-log/2026-12-03.md).
inline float widen_one(float x) {
  return x;
}
inline float widen_one(c10::BFloat16 x) {
  // bf16 is the top half of an fp32 (exact): a shift, which vectorises.
  return c10::bit_cast<float>(static_cast<uint32_t>(x.x) << 16);
}
inline float widen_one(c10::Half x) {
  return static_cast<float>(x);
}

template <typename T>
double sum_squares(const T* data, int64_t begin, int64_t end) {
  constexpr int kLanes = 16;
  double acc[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double x = widen_one(data[i + l]);
      acc[l] += x * x;
    }
  for (; i < end; ++i) {
    const double x = widen_one(data[i]);
    acc[0] += x * x;
  }
  double s = 0;
  for (double a : acc) s += a;
  return s;
}

double sum_of_squares(const void* data, Type type, int64_t begin, int64_t end) {
  switch (type) {
    case Type::kBFloat16:
      return sum_squares(static_cast<const c10::BFloat16*>(data), begin, end);
    case Type::kHalf:
      return sum_squares(static_cast<const c10::Half*>(data), begin, end);
    default:
      return sum_squares(static_cast<const float*>(data), begin, end);
  }
}

}  // namespace

Table table() {
  return {&adam, &adagrad, &by_grad<LionOp>, &sum_of_squares};
}

}  // namespace CPU_CAPABILITY
}  // namespace dscpp::ops::cpu::kernels
