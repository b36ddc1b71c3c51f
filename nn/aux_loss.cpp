// The aux-loss side channel: see aux_loss.h.
#include "dscpp/nn/aux_loss.h"

#include "dscpp/error.h"

namespace dscpp::nn {

namespace {
thread_local AuxLossScope* innermost = nullptr;
}

AuxLossScope::AuxLossScope() : outer_(innermost) {
  innermost = this;
}

AuxLossScope::~AuxLossScope() {
  innermost = outer_;
}

void add_aux_loss(const at::Tensor& loss) {
  if (!innermost)
    throw dscpp::Error(
        "add_aux_loss outside an AuxLossScope: run the layers under one (the pipeline engine "
        "does), or the auxiliary loss would never reach backward");
  if (loss.dim() != 0)
    throw dscpp::Error("add_aux_loss: the loss must be a 0-dim tensor, got " +
                       std::to_string(loss.dim()) + " dimensions");
  innermost->sum_ = innermost->sum_.defined() ? innermost->sum_.add(loss) : loss;
}

}  // namespace dscpp::nn
