// The autograd wiring of the fused ops: one torch::autograd::Function each, saving what its
// backward reads. The only translation unit of ops that includes LibTorch's
// autograd headers (they are heavy; CI compiles on 2 cores).
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/ops_impl.h"

#include <ATen/record_function.h>

#include <vector>

namespace dscpp::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct BiasGeluFunction : torch::autograd::Function<BiasGeluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                            bool tanh_approximation) {
    // The bias input itself, not bias.contiguous() or a detached alias: a saved input keeps
    // its TensorImpl, so when ZeRO stage 3 releases the parameter after forward and gathers
    // it again before backward (set_data on that impl), backward reads the gathered values.
    ctx->save_for_backward({x, bias});
    ctx->saved_data["tanh"] = tanh_approximation;
    return detail::bias_gelu_forward(x, bias, tanh_approximation);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto [dx, dbias] =
        detail::bias_gelu_backward(grads[0], saved[0], saved[1], ctx->saved_data["tanh"].toBool(),
                                   ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {dx, dbias, at::Tensor()};
  }
};

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t ignore_index) {
    detail::CrossEntropyForward f = detail::cross_entropy_forward(logits, targets, ignore_index);
    // N log-sum-exps and the count, not softmax or fp32 logits: backward recomputes the
    // softmax from the logits, which are kept anyway (they are the op's input).
    ctx->save_for_backward({logits, targets, f.lse, f.count});
    ctx->saved_data["ignore_index"] = ignore_index;
    return f.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor dlogits;
    if (ctx->needs_input_grad(0))
      dlogits = detail::cross_entropy_backward(grads[0], saved[0], saved[1], saved[2], saved[3],
                                               ctx->saved_data["ignore_index"].toInt());
    return {dlogits, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// Each op is one record function under its own name, so observers (the flops profiler) see
// it as one operator with its inputs, whichever path (kernel or ATen) runs inside.
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh_approximation) {
  RECORD_FUNCTION("dscpp::bias_gelu", std::vector<c10::IValue>({x, bias}));
  return BiasGeluFunction::apply(x, bias, tanh_approximation);
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                         int64_t ignore_index) {
  RECORD_FUNCTION("dscpp::cross_entropy", std::vector<c10::IValue>({logits, targets}));
  return CrossEntropyFunction::apply(logits, targets, ignore_index);
}

}  // namespace dscpp::ops
