// MuonH's per-matrix step (muonh_update.h).
#include "dscpp/optim/muonh_update.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <array>
#include <vector>

#include "dscpp/optim/muon_update.h"

namespace dscpp::optim {

namespace {

using Coefficients = std::array<double, 3>;

const std::vector<Coefficients>& coefficient_set(const std::string& name) {
  static const std::vector<Coefficients> quintic = {{4.0848, -6.8946, 2.9270},
                                                    {3.9505, -6.3029, 2.6377},
                                                    {3.7418, -5.5913, 2.3037},
                                                    {2.8769, -3.1427, 1.2046},
                                                    {2.8366, -3.0525, 1.2012}};
  static const std::vector<Coefficients> simple = {{3.4445, -4.7750, 2.0315}};
  if (name == "quintic") return quintic;
  if (name == "simple") return simple;
  throw MuonError("MuonH: coefficient_type must be \"quintic\" or \"simple\", not \"" + name +
                  "\"");
}

// On CUDA the iteration's float32 products run on the tensor cores in TF32, as JAX's default
// precision runs Levanter's float32 dots on GPUs (on TPUs it takes bfloat16 passes); in full
// float32 the step of a 1.31 B GPT took ten times bf16 training's (docs/perf-log/2026-12-07.md Y).
// The flag is process-wide: restored on leaving, so the model's own products are not touched.
class Tf32Products {
 public:
  explicit Tf32Products(bool on) : was_(at::globalContext().allowTF32CuBLAS()) {
    if (on) at::globalContext().setAllowTF32CuBLAS(true);
  }
  ~Tf32Products() { at::globalContext().setAllowTF32CuBLAS(was_); }
  Tf32Products(const Tf32Products&) = delete;
  Tf32Products& operator=(const Tf32Products&) = delete;

 private:
  bool was_;
};

}  // namespace

at::Tensor hyperball_newton_schulz(const at::Tensor& x_in, const MuonHOptions& o) {
  const auto& set = coefficient_set(o.coefficients);
  const Tf32Products tf32(x_in.is_cuda());
  at::Tensor x = x_in.to(at::kFloat);
  x = x / (at::linalg_vector_norm(x) + o.eps);
  const bool transpose = x.size(0) > x.size(1);
  if (transpose) x = x.t();
  for (int i = 0; i < o.steps; ++i) {
    const Coefficients& k = set[static_cast<size_t>(i) % set.size()];
    const at::Tensor a = at::matmul(x, x.t());
    const at::Tensor b = k[1] * a + k[2] * at::matmul(a, a);
    x = k[0] * x + at::matmul(b, x);
  }
  return transpose ? x.t() : x;
}

void muonh_step(at::Tensor param, at::Tensor momentum, const at::Tensor& grad, double lr,
                const MuonHOptions& o) {
  const at::Tensor g = grad.to(at::kFloat);
  momentum.mul_(o.momentum).add_(g);
  // (without Nesterov the momentum itself: nothing below writes u)
  const at::Tensor u = o.nesterov ? momentum * o.momentum + g : momentum;
  // (a view of param's storage per matrix: reshape of a contiguous tensor is one)
  const at::Tensor p = param.reshape(u.sizes());
  const at::Tensor us = u.reshape({-1, u.size(-2), u.size(-1)});
  const at::Tensor ps = p.reshape({-1, u.size(-2), u.size(-1)});
  for (int64_t i = 0; i < us.size(0); ++i) {
    const at::Tensor w = ps[i];
    const at::Tensor orth = hyperball_newton_schulz(us[i], o);
    const at::Tensor norm = at::linalg_vector_norm(w);
    const at::Tensor moved =
        w - orth * (norm / at::clamp_min(at::linalg_vector_norm(orth), 1e-10)) * lr;
    w.copy_(moved / at::clamp_min(at::linalg_vector_norm(moved), 1e-10) * norm);
  }
}

}  // namespace dscpp::optim
