// Calls back when autograd has accumulated a parameter's gradient: a post hook on the
// parameter's grad accumulator. The accumulator node is kept alive in the returned handle,
// since a hook on a node that autograd has dropped (and remade) never fires. While a split
// backward's scope is open (ops/deferred_grads.h), the accumulator hands its gradient to the
// scope instead (a capture pre-hook installed here too) and the callback waits for the
// gradient's delivery (W), which runs it.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace dscpp::zero {

// on_ready(i) runs after params[i].grad has received this backward's contribution.
std::shared_ptr<void> register_ready_hooks(const std::vector<at::Tensor>& params,
                                           std::function<void(int)> on_ready);

}  // namespace dscpp::zero
