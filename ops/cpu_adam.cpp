// The CPU optimizers' front: argument checks, the per-step scalars, the split over threads
// and the choice of instruction set (cpu_adam.h).
#include "dscpp/ops/cpu_adam.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "dscpp/error.h"
#include "dscpp/ops/cpu_adam_kernels.h"
#include "dscpp/ops/cpu_parallel.h"

namespace dscpp::ops::cpu {
namespace {

using kernels::Type;

const kernels::Table& table() {
  return kernels::best_table();
}

Type type_of(const at::Tensor& t, const char* what, bool float_only) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return Type::kFloat;
    case at::kBFloat16:
      if (!float_only) return Type::kBFloat16;
      break;
    case at::kHalf:
      if (!float_only) return Type::kHalf;
      break;
    default:
      break;
  }
  throw Error(fmt::format("cpu optimizer: {} is {}, expected {}", what,
                          std::string(c10::toString(t.scalar_type())),
                          float_only ? "float32" : "float32, bfloat16 or float16"));
}

void check(const at::Tensor& t, const char* what, int64_t n, bool float_only) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous() || t.numel() != n)
    throw Error(
        fmt::format("cpu optimizer: {} must be a contiguous CPU tensor of {} elements{}", what, n,
                    t.defined() ? fmt::format(" (it has {} on {})", t.numel(), t.device().str())
                                : std::string(" (it is undefined)")));
  type_of(t, what, float_only);
}

kernels::Arrays arrays(const StepTensors& t, const at::Tensor& s0, const at::Tensor& s1) {
  if (!t.param.defined() || t.param.dim() != 1)
    throw Error("cpu optimizer: param must be a 1-D fp32 tensor");
  const int64_t n = t.param.numel();
  check(t.param, "param", n, true);
  check(t.grad, "grad", n, false);
  check(s0, "optimizer state", n, true);
  if (s1.defined()) check(s1, "optimizer state", n, true);
  kernels::Arrays a;
  a.param = t.param.data_ptr<float>();
  a.grad = t.grad.data_ptr();
  a.grad_type = type_of(t.grad, "grad", false);
  a.state0 = s0.data_ptr<float>();
  a.state1 = s1.defined() ? s1.data_ptr<float>() : nullptr;
  if (t.param_copy.defined()) {
    check(t.param_copy, "param_copy", n, false);
    a.copy = t.param_copy.data_ptr();
    a.copy_type = type_of(t.param_copy, "param_copy", false);
  }
  return a;
}

// A step's ranges are whole tiles (cpu_adam_kernels_impl.h), so the split over threads never
// changes an element's arithmetic; below kGrain elements a thread costs more than it saves.
constexpr int64_t kTile = 1024, kGrain = 1 << 15;

void parallel(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_ranges(n, kTile, kGrain, fn);
}

void run(kernels::Kernel k, const kernels::Arrays& a, const kernels::Scalars& s, int64_t n) {
  parallel(n, [&](int64_t begin, int64_t end) { k(a, s, begin, end); });
}

}  // namespace

namespace kernels {
const Table& best_table() {
  static const Table t = [] {
    // ATen's own choice for this CPU ("AVX512", "AVX2", "DEFAULT", ...), which
    // ATEN_CPU_CAPABILITY can lower.
    const std::string cap = at::get_cpu_capability();
#ifdef DSCPP_CPU_AVX512
    if (cap == "AVX512") return AVX512::table();
#endif
#ifdef DSCPP_CPU_AVX2
    if (cap == "AVX2" || cap == "AVX512") return AVX2::table();
#endif
    (void)cap;
    return DEFAULT::table();
  }();
  return t;
}
}  // namespace kernels

void adam_step(const StepTensors& t, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
               const AdamArgs& args) {
  if (!exp_avg_sq.defined()) throw Error("cpu optimizer: Adam needs exp_avg_sq");
  const kernels::Arrays a = arrays(t, exp_avg, exp_avg_sq);
  const double step = static_cast<double>(args.step);
  const double bc1 = args.bias_correction ? 1 - std::pow(args.beta1, step) : 1.0;
  const double bc2 = args.bias_correction ? 1 - std::pow(args.beta2, step) : 1.0;
  kernels::Scalars s;
  s.grad_scale = t.grad_scale;
  s.beta1 = static_cast<float>(args.beta1);
  s.beta2 = static_cast<float>(args.beta2);
  s.one_minus_beta1 = static_cast<float>(1 - args.beta1);
  s.one_minus_beta2 = static_cast<float>(1 - args.beta2);
  s.eps = static_cast<float>(args.eps);
  s.step_size = static_cast<float>(-args.lr / bc1);
  s.bias_correction2 = static_cast<float>(1 / std::sqrt(bc2));
  s.decay = args.weight_decay > 0;
  s.decoupled = args.adam_w_mode;
  s.weight_decay =
      static_cast<float>(args.adam_w_mode ? -args.lr * args.weight_decay : args.weight_decay);
  run(table().adam, a, s, t.param.numel());
}

void adagrad_step(const StepTensors& t, const at::Tensor& sum, const AdagradArgs& args) {
  const kernels::Arrays a = arrays(t, sum, at::Tensor());
  kernels::Scalars s;
  s.grad_scale = t.grad_scale;
  s.eps = static_cast<float>(args.eps);
  const double clr = args.lr / (1 + (static_cast<double>(args.step) - 1) * args.lr_decay);
  s.step_size = static_cast<float>(-clr);
  s.decay = args.weight_decay > 0;
  s.weight_decay = static_cast<float>(args.weight_decay);
  run(table().adagrad, a, s, t.param.numel());
}

void lion_step(const StepTensors& t, const at::Tensor& exp_avg, const LionArgs& args) {
  const kernels::Arrays a = arrays(t, exp_avg, at::Tensor());
  kernels::Scalars s;
  s.grad_scale = t.grad_scale;
  s.beta1 = static_cast<float>(args.beta1);
  s.beta2 = static_cast<float>(args.beta2);
  s.one_minus_beta1 = static_cast<float>(1 - args.beta1);
  s.one_minus_beta2 = static_cast<float>(1 - args.beta2);
  s.step_size = static_cast<float>(-args.lr);
  s.decay = args.weight_decay > 0;
  s.weight_decay = static_cast<float>(1 - args.lr * args.weight_decay);
  run(table().lion, a, s, t.param.numel());
}

std::string capability() {
  const kernels::Table& t = table();
#ifdef DSCPP_CPU_AVX512
  if (t.adam == kernels::AVX512::table().adam) return "AVX512";
#endif
#ifdef DSCPP_CPU_AVX2
  if (t.adam == kernels::AVX2::table().adam) return "AVX2";
#endif
  (void)t;
  return "DEFAULT";
}

int threads() {
  return std::max(1, at::get_num_threads());
}

void for_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  parallel(n, fn);
}

}  // namespace dscpp::ops::cpu
