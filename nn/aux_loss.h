// Auxiliary losses (the experts' load-balancing losses) as a side channel beside the
// activation, as Megatron's: a layer's forward calls add_aux_loss(loss), and whoever runs the
// layers under an AuxLossScope takes their sum and adds it to what it back-propagates (the
// pipeline engine: to the stage's loss, or beside its output's received gradient, with the
// loss's scaling). So a layer with an extra loss needs no activation type of its own.
#pragma once

#include <ATen/core/Tensor.h>

namespace dscpp::nn {

// Inside a layer's forward: adds a 0-dim loss to the innermost open AuxLossScope of this
// thread. Outside every scope it throws dscpp::Error (the loss would otherwise be lost).
void add_aux_loss(const at::Tensor& loss);

// Collects the aux losses added on this thread while it is the innermost open scope.
class AuxLossScope {
 public:
  AuxLossScope();
  ~AuxLossScope();
  AuxLossScope(const AuxLossScope&) = delete;
  AuxLossScope& operator=(const AuxLossScope&) = delete;
  // Their sum so far (undefined when none was added).
  const at::Tensor& sum() const { return sum_; }

 private:
  friend void add_aux_loss(const at::Tensor& loss);
  at::Tensor sum_;
  AuxLossScope* outer_;
};

}  // namespace dscpp::nn
