// MuonH, Marin's Muon on the hyperball (Wen, Dang, Lyu, Ma, Liang 2025, "Hyperball
// Optimization"; Levanter's muonh.py, the recipe of Marin's MoE runs), for one matrix:
//   buf <- momentum · buf + grad                       (a sum, not DeepSpeed's lerp)
//   u   <- nesterov ? momentum · buf + grad : buf
//   u   <- NS(u)                                       (see below)
//   p'  <- p - lr · u · ‖p‖ / max(‖u‖, 1e-10)
//   p   <- p' / max(‖p'‖, 1e-10) · ‖p‖                 (‖·‖: Frobenius)
// so each matrix keeps its norm (its initial one) and moves by lr of it a step; there is no
// weight decay and no shape scale. NS is Levanter's zeropower_via_newtonschulz5 in fp32: X / (‖X‖
// + eps), transposed when it has more rows than columns, then `steps` quintic steps X <- aX +
// (bA + cA²)X, A = XXᵀ, with step i's coefficients the i-th of the set (cyclically):
//   "quintic" (Levanter's default): five sets, from NVIDIA's Emerging-Optimizers;
//   "simple": Keller Jordan's (3.4445, -4.7750, 2.0315) at every step.
// A stacked expert group [E, rows, cols] is E matrices, each on its own.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace dscpp::optim {

struct MuonHOptions {
  double momentum = 0.95;
  bool nesterov = true;
  int steps = 5;                         // Levanter's backend_steps
  double eps = 1e-8;                     // Levanter's muon_epsilon
  std::string coefficients = "quintic";  // or "simple"
};

// Newton-Schulz of x (one matrix [rows, cols]) as above, in fp32 (its products in TF32 on CUDA,
// as JAX's default precision has them on GPUs).
at::Tensor hyperball_newton_schulz(const at::Tensor& x, const MuonHOptions& o);

// One step of one matrix (or stacked group): `param` (fp32) and `momentum` updated in place
// from `grad` (any floating type, not changed), with learning rate lr.
void muonh_step(at::Tensor param, at::Tensor momentum, const at::Tensor& grad, double lr,
                const MuonHOptions& o);

}  // namespace dscpp::optim
