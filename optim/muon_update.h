// Muon's update for one matrix (MomentUm Orthogonalized by Newton-Schulz), as DeepSpeed 0.19.8
// computes it (runtime/zero/muon/original_muon.py, after Keller Jordan's Muon): the momentum
// takes the gradient, the Nesterov blend of the two is orthogonalised by a Newton-Schulz
// iteration, and scaled by sqrt(max(1, rows / cols)). The optimizer that applies it (learning
// rate, weight decay, the auxiliary Adam for the other parameters) and the division of the work
// among ranks are built on this.
//
// Two iterations, DeepSpeed's `ns_method`:
//   "standard": the quintic iteration X <- aX + (bA + cA²)X, A = XXᵀ, on the matrix itself;
//   "gram": the same map iterated on the small Gram matrix R = XXᵀ (a restart at step 2 keeps
//           it stable in half precision); the standard iteration for square or tall inputs.
// Each runs in DeepSpeed's precision for the device: on a GPU, gram in fp16 and standard in
// bf16; on the CPU, standard in bf16 and gram in fp16 where DeepSpeed's CPU accelerator says
// fp16 is supported (oneDNN's fp16 on the CPU: AVX512-FP16 or AMX-FP16), else in fp32.
// A non-finite gradient leaves the momentum as it was and comes back as the update, so that the
// loss scaler still sees the overflow and skips the step.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "dscpp/error.h"

namespace dscpp::optim {

class MuonError : public dscpp::Error {
 public:
  using dscpp::Error::Error;
};

enum class NsMethod { Standard, Gram };

// "standard" | "gram"; anything else is a MuonError naming both.
NsMethod ns_method_from(const std::string& name);

// The dtype an iteration runs in on `device` (see above).
at::ScalarType ns_compute_dtype(NsMethod method, const c10::Device& device);

// The orthogonalisation of G (2-D, or a batch of matrices [..., rows, cols]) by `steps`
// Newton-Schulz steps, in the method's compute dtype.
at::Tensor newton_schulz(const at::Tensor& g, int steps, NsMethod method);

struct MuonUpdateOptions {
  double beta = 0.95;  // the momentum
  int ns_steps = 5;
  bool nesterov = true;
  NsMethod method = NsMethod::Gram;
  // The experts' stacked matrices [experts, rows, cols]: each orthogonalised on its own.
  bool expert_group = false;
  // An attention projection [heads x head_dim, in]: each head's rows orthogonalised on their own.
  std::optional<int64_t> num_heads;
};

// The update for a parameter of grad's shape, in grad's dtype. Updates `momentum` in place
// (momentum <- lerp(momentum, grad, 1 - beta), unless grad holds a non-finite value), and with
// Nesterov also `grad` (grad <- lerp(grad, momentum, beta)), as DeepSpeed does.
at::Tensor muon_update(at::Tensor& grad, at::Tensor& momentum, const MuonUpdateOptions& options);

}  // namespace dscpp::optim
