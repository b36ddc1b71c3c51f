// register_ready_hooks: post hooks on AccumulateGrad nodes.
#include "dscpp/zero/grad_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dscpp/ops/deferred_grads.h"

namespace dscpp::zero {

namespace {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(int index, std::function<void(int)> on_ready)
      : index_(index), on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    // B of a split backward: the gradient went to the scope; W's delivery calls again.
    if (ops::capturing()) return outputs;
    on_ready_(index_);
    return outputs;
  }

 private:
  int index_;
  std::function<void(int)> on_ready_;
};

struct Accumulators {
  std::vector<std::shared_ptr<torch::autograd::Node>> nodes;
};

}  // namespace

std::shared_ptr<void> register_ready_hooks(const std::vector<at::Tensor>& params,
                                           std::function<void(int)> on_ready) {
  auto keep = std::make_shared<Accumulators>();
  for (size_t i = 0; i < params.size(); ++i) {
    auto node = torch::autograd::impl::grad_accumulator(params[i]);
    node->add_post_hook(std::make_unique<ReadyHook>(static_cast<int>(i), on_ready));
    ops::add_capture_hook(params[i]);
    keep->nodes.push_back(std::move(node));
  }
  return keep;
}

}  // namespace dscpp::zero
