// Muon's per-matrix update (muon_update.h).
#include "dscpp/optim/muon_update.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <ATen/ATen.h>

#include <cmath>

namespace dscpp::optim {

namespace {

// The quintic's coefficients (Keller Jordan's, as DeepSpeed uses them). DeepSpeed writes
// `c * A @ A`, which Python reads as (c * A) @ A: the products below keep that order, so that
// the roundings are the same.
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

bool tall(const at::Tensor& g) {
  return g.size(-2) > g.size(-1);
}

at::Tensor normalised(const at::Tensor& x) {
  // Tensor.norm(dim=(-2, -1)) in PyTorch: the vector 2-norm over both dimensions.
  return x / (at::linalg_vector_norm(x, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true) + 1e-7);
}

at::Tensor quintic_steps(at::Tensor x, int steps) {
  for (int i = 0; i < steps; ++i) {
    const at::Tensor a = at::matmul(x, x.mT());
    const at::Tensor b = kB * a + at::matmul(kC * a, a);
    x = kA * x + at::matmul(b, x);
  }
  return x;
}

at::Tensor standard(const at::Tensor& g, int steps, at::ScalarType dtype) {
  at::Tensor x = g.to(dtype);
  if (tall(g)) x = x.mT();
  x = quintic_steps(normalised(x), steps);
  return tall(g) ? x.mT() : x;
}

at::Tensor gram(const at::Tensor& g, int steps, at::ScalarType dtype) {
  // Normalised before the cast, in a dtype the input cannot have left: fp16 stops at 65504.
  const at::ScalarType norm_dtype = g.scalar_type() == at::kHalf ? at::kFloat : g.scalar_type();
  at::Tensor x = g.to(norm_dtype);
  if (tall(g)) x = x.mT();
  const int64_t n = x.size(-2), m = x.size(-1);
  x = normalised(x).to(dtype);
  if (m <= n) {  // square: no saving over the standard iteration
    x = quintic_steps(x, steps);
    return tall(g) ? x.mT() : x;
  }
  at::Tensor r = at::matmul(x, x.mT());
  at::Tensor q;
  constexpr int kRestartAt = 2;
  for (int i = 0; i < steps; ++i) {
    if (i == kRestartAt) {
      x = at::matmul(q, x);
      r = at::matmul(x, x.mT());
      q = at::Tensor();
    }
    const at::Tensor z = kB * r + at::matmul(kC * r, r);
    if (!q.defined()) {
      q = z.clone();
      q.diagonal(0, -2, -1).add_(kA);
    } else {
      q = kA * q + at::matmul(z, q);
    }
    if (i < steps - 1 && i + 1 != kRestartAt) {
      const at::Tensor rz = kA * r + at::matmul(z, r);
      r = kA * rz + at::matmul(z, rz);
    }
  }
  return tall(g) ? at::matmul(x.mT(), q.mT()) : at::matmul(q, x);
}

// sqrt(max(1, rows / cols)).
double aspect_ratio_scale(int64_t rows, int64_t cols) {
  return rows > cols ? std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)) : 1.0;
}

}  // namespace

NsMethod ns_method_from(const std::string& name) {
  if (name == "gram") return NsMethod::Gram;
  if (name == "standard") return NsMethod::Standard;
  throw MuonError("ns_method: expected \"gram\" or \"standard\", found \"" + name + "\"");
}

namespace {

// DeepSpeed's CPU accelerator's is_fp16_supported: oneDNN's fp16 on this CPU (AVX512-FP16 or
// AMX-FP16), through the same registered op torch.ops.mkldnn._is_mkldnn_fp16_supported calls.
bool cpu_fp16_supported() {
  static const bool supported = [] {
    try {
      return c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_is_mkldnn_fp16_supported", "")
          .typed<bool()>()
          .call();
    } catch (const std::exception&) {
      return false;
    }
  }();
  return supported;
}

}  // namespace

at::ScalarType ns_compute_dtype(NsMethod method, const c10::Device& device) {
  if (method == NsMethod::Gram)
    return device.is_cuda() || cpu_fp16_supported() ? at::kHalf : at::kFloat;
  return at::kBFloat16;
}

at::Tensor newton_schulz(const at::Tensor& g, int steps, NsMethod method) {
  if (g.dim() < 2)
    throw MuonError("Newton-Schulz needs a matrix, got " + std::to_string(g.dim()) +
                    " dimension(s)");
  const at::ScalarType dtype = ns_compute_dtype(method, g.device());
  return method == NsMethod::Gram ? gram(g, steps, dtype) : standard(g, steps, dtype);
}

at::Tensor muon_update(at::Tensor& grad, at::Tensor& momentum, const MuonUpdateOptions& o) {
  const at::ScalarType orig = grad.scalar_type();
  // Evaluated on the device: no synchronisation.
  const at::Tensor finite = at::isfinite(grad).all();
  momentum.copy_(at::where(finite, momentum.lerp(grad, 1 - o.beta), momentum));
  at::Tensor update = o.nesterov ? grad.lerp_(momentum, o.beta) : momentum;
  if (o.num_heads) {
    const int64_t heads = *o.num_heads;
    if (update.dim() != 2)
      throw MuonError("per-head Muon needs a 2-D attention projection, got " +
                      std::to_string(update.dim()) + " dimensions");
    const int64_t out = update.size(0), in = update.size(1);
    if (heads < 1 || out % heads != 0)
      throw MuonError("per-head Muon: " + std::to_string(out) +
                      " output rows do not split evenly across " + std::to_string(heads) +
                      " heads");
    const int64_t head_dim = out / heads;
    at::Tensor per_head = newton_schulz(update.view({heads, head_dim, in}), o.ns_steps, o.method) *
                          aspect_ratio_scale(head_dim, in);
    return per_head.reshape({out, in}).to(orig);
  }
  if (o.expert_group) {
    update = newton_schulz(update, o.ns_steps, o.method) *
             aspect_ratio_scale(update.size(-2), update.size(-1));
  } else {
    if (update.dim() == 4) update = update.view({update.size(0), -1});  // conv filters
    update = newton_schulz(update, o.ns_steps, o.method);
    update.mul_(aspect_ratio_scale(grad.size(-2), grad.size(-1)));
  }
  if (update.scalar_type() != orig) update = update.to(orig);
  // Without Nesterov the update is the (finite) momentum: the overflow must still show.
  return at::where(finite, update, grad.to(orig));
}

}  // namespace dscpp::optim
