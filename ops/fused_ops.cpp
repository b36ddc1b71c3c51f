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

struct QkvHeadsFunction : torch::autograd::Function<QkvHeadsFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads) {
    TORCH_CHECK(qkv.dim() == 3 && heads >= 1 && qkv.size(2) % (3 * heads) == 0,
                "qkv_heads: expected qkv [batch, seq, 3 * hidden] with hidden divisible by the ",
                heads, " heads, got ", qkv.sizes());
    const int64_t batch = qkv.size(0), seq = qkv.size(1), dim = qkv.size(2) / (3 * heads);
    ctx->saved_data["sizes"] = std::vector<int64_t>{batch, seq, heads, dim};
    auto parts = qkv.view({batch, seq, 3, heads, dim}).permute({2, 0, 3, 1, 4}).unbind(0);
    return {parts[0], parts[1], parts[2]};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->saved_data["sizes"].toIntVector();
    const at::Tensor& any = grads[0].defined()   ? grads[0]
                            : grads[1].defined() ? grads[1]
                                                 : grads[2];
    at::Tensor out = at::empty({s[0], s[1], 3, s[2], s[3]}, any.options());
    for (int64_t i = 0; i < 3; ++i) {
      at::Tensor part = out.select(2, i);  // [B, S, heads, dim], rows 3h apart
      if (grads[i].defined()) {
        part.copy_(grads[i].transpose(1, 2));
      } else {
        part.zero_();
      }
    }
    return {out.view({s[0], s[1], 3 * s[2] * s[3]}), at::Tensor()};
  }
};

struct AddLayerNormFunction : torch::autograd::Function<AddLayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& branch,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    detail::AddLayerNormForward f = detail::add_layer_norm_forward(x, branch, weight, bias, eps);
    // Undefined incoming gradients stay undefined (h or y unused): no zero tensors to read.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({f.h, weight, bias, f.mean, f.rstd});
    return {f.h, f.y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool need_dx = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    auto [dx, dw, db] = detail::add_layer_norm_backward(
        grads[0], grads[1], saved[0], saved[1], saved[2], saved[3], saved[4],
        {need_dx, ctx->needs_input_grad(2), ctx->needs_input_grad(3)});
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(),
            ctx->needs_input_grad(1) ? dx : at::Tensor(), dw, db, at::Tensor()};
  }
};

struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return detail::swiglu_forward(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    return {detail::swiglu_backward(grads[0], saved[0])};
  }
};

}  // namespace

std::array<at::Tensor, 2> add_layer_norm(const at::Tensor& x, const at::Tensor& branch,
                                         const at::Tensor& weight, const at::Tensor& bias,
                                         double eps) {
  RECORD_FUNCTION("dscpp::add_layer_norm", std::vector<c10::IValue>({x, branch, weight, bias}));
  auto out = AddLayerNormFunction::apply(x, branch, weight, bias, eps);
  return {out[0], out[1]};
}

std::array<at::Tensor, 3> qkv_heads(const at::Tensor& qkv, int64_t heads) {
  auto out = QkvHeadsFunction::apply(qkv, heads);
  return {out[0], out[1], out[2]};
}

// Each op is one record function under its own name, so observers (the flops profiler) see
// it as one operator with its inputs, whichever path (kernel or ATen) runs inside.
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh_approximation) {
  RECORD_FUNCTION("dscpp::bias_gelu", std::vector<c10::IValue>({x, bias}));
  return BiasGeluFunction::apply(x, bias, tanh_approximation);
}

at::Tensor swiglu(const at::Tensor& x) {
  RECORD_FUNCTION("dscpp::swiglu", std::vector<c10::IValue>({x}));
  return SwigluFunction::apply(x);
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                         int64_t ignore_index) {
  RECORD_FUNCTION("dscpp::cross_entropy", std::vector<c10::IValue>({logits, targets}));
  return CrossEntropyFunction::apply(logits, targets, ignore_index);
}

}  // namespace dscpp::ops
