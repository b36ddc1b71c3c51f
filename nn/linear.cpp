// nn::linear: custom autograd functions that save the weight parameter itself.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/linear.h"

#include "dscpp/nn/fp8_linear.h"

#include "dscpp/ops/deferred_grads.h"
#include "dscpp/ops/grad_destination.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <vector>

namespace dscpp::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor forward_product(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor out = bias.defined() ? at::addmm(bias, x2, weight.t()) : at::mm(x2, weight.t());
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return out.view(sizes);
}

// Gradients of x and weight (and the bias's, when `with_bias`).
variable_list backward_products(AutogradContext* ctx, const at::Tensor& grad, bool with_bias) {
  auto saved = ctx->get_saved_variables();
  const at::Tensor& x = saved[0];
  const at::Tensor& weight = saved[1];
  at::Tensor g = grad.reshape({-1, grad.size(-1)});
  variable_list out(with_bias ? 3 : 2);
  if (ctx->needs_input_grad(0)) out[0] = at::mm(g, weight).view(x.sizes());
  if (ctx->needs_input_grad(1)) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    // Written into ZeRO's bucket when it gives a destination (ops/grad_destination.h); put off
    // to W inside a split backward (ops/deferred_grads.h).
    auto product = [weight, gt = g.t(), x2] {
      return ops::write_weight_grad(weight, gt, x2) ? at::Tensor() : at::mm(gt, x2);
    };
    if (!ops::defer_weight_grad(weight, product)) out[1] = product();
  }
  if (with_bias && ctx->needs_input_grad(2)) out[2] = g.sum(0);
  return out;
}

// Autograd takes no undefined tensor as an input, hence one function with a bias and one without.
struct LinearWithBias : torch::autograd::Function<LinearWithBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    return forward_product(x, weight, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return backward_products(ctx, grads[0], true);
  }
};

struct LinearNoBias : torch::autograd::Function<LinearNoBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    return forward_product(x, weight, at::Tensor());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return backward_products(ctx, grads[0], false);
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (const Fp8Recipe* r = current_fp8_recipe(); r && fp8_applies(x, weight))
    return fp8_linear(x, weight, bias, *r);
  // One record function with the parameters themselves as inputs (inside, addmm sees a
  // transposed view), so the flops profiler counts it once and knows whose weight it is.
  RECORD_FUNCTION("dscpp::linear", std::vector<c10::IValue>({x, weight, bias}));
  return bias.defined() ? LinearWithBias::apply(x, weight, bias) : LinearNoBias::apply(x, weight);
}

}  // namespace dscpp::nn
