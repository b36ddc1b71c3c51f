// The FP8 linear (fp8_linear.h): its autograd function and the per-thread scope.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/fp8_linear.h"

#include "dscpp/nn/fp8_meta.h"
#include "dscpp/ops/deferred_grads.h"
#include "dscpp/ops/fp8.h"
#include "dscpp/ops/grad_destination.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#ifdef DSCPP_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <optional>
#include <vector>

namespace dscpp::nn {

namespace fp8 = ops::fp8;

namespace {

thread_local Fp8ScopeState tl_scope;
thread_local bool tl_weight_casts_not_kept = false;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

fp8::Format grad_format(const Fp8Recipe& r) {
  return r.hybrid ? fp8::Format::E5M2 : fp8::Format::E4M3;
}

// One scale per operand (tensorwise and delayed), not per row.
bool tensorwise(const Fp8Recipe& r) {
  return r.scaling != Fp8Scaling::Rowwise;
}

// A delayed product's state: its module's Fp8Meta tensors and its slot; empty otherwise.
struct Delayed {
  at::Tensor history, scale;
  int64_t slot = -1;
};

// x quantised, one scale or one per slice along `reduced` (rowwise, scales rounded to powers of
// two as torchao's rowwise recipe has them), in the layouts asked for. Delayed: by the factor
// the slot's operand holds, its amax recorded for the next update.
fp8::Layouts quantize(const at::Tensor& x, int64_t reduced, fp8::Format f, const Fp8Recipe& r,
                      bool rows, bool transposed, const Delayed& d = {},
                      Fp8Operand operand = Fp8Operand::Input) {
  if (r.scaling == Fp8Scaling::Delayed) {
    const int64_t column = 3 * d.slot + static_cast<int64_t>(operand);
    record_fp8_amax(d.history, d.slot, operand, fp8::amax(x));
    return fp8::quantize_layouts_by_factor(x, d.scale.narrow(0, column, 1).reshape({}), f, rows,
                                           transposed);
  }
  return fp8::quantize_layouts(x, tensorwise(r) ? -1 : reduced, f, r.margin, !tensorwise(r), rows,
                               transposed);
}

// The operand b [k, n] of a product from bᵀ [n, k] quantised row-major (scale [n, 1] or a
// scalar): its transposed view is the column-major b that _scaled_mm takes, without a copy.
fp8::Quantized as_right(const fp8::Quantized& b_t) {
  return {b_t.data.t(), b_t.scale.dim() == 2 ? b_t.scale.t() : b_t.scale};
}

// y = x · Wᵀ: x per row and W per output row (both reduced over in). With one scale a tensor
// (tensorwise, delayed), the casts backward needs come out of forward's passes and are what it
// keeps: xᵀ's fp8 (dW's operand) instead of x, one byte an element instead of two; Wᵀ's fp8
// (dx's operand), so that W is not read and cast a second time in backward (88 of the 352
// casts of a 1.31 B step, and as many amax reductions: perf-log 2026-12-07 P).
at::Tensor forward_and_save(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const Fp8Recipe& r, const Delayed& d) {
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  const bool keep_xt = tensorwise(r) && weight.requires_grad();
  const bool keep_wt = tensorwise(r) && x.requires_grad() && !tl_weight_casts_not_kept;
  const fp8::Layouts xq = quantize(x2, 1, fp8::Format::E4M3, r, true, keep_xt, d);
  const fp8::Layouts wq =
      quantize(weight, 1, fp8::Format::E4M3, r, true, keep_wt, d, Fp8Operand::Weight);
  at::Tensor out = fp8::scaled_mm(xq.rows, as_right(wq.rows), x.scalar_type(), bias);
  const at::Tensor wt = keep_wt ? wq.transposed.data : at::Tensor();
  const at::Tensor wt_scale = keep_wt ? wq.transposed.scale : at::Tensor();
  if (keep_xt) {
    ctx->save_for_backward({xq.transposed.data, xq.transposed.scale, weight, wt, wt_scale});
  } else {
    ctx->save_for_backward({x2, at::Tensor(), weight, wt, wt_scale});
  }
  ctx->saved_data["x_sizes"] = x.sizes().vec();
  ctx->saved_data["hybrid"] = r.hybrid;
  ctx->saved_data["scaling"] = static_cast<int64_t>(r.scaling);
  ctx->saved_data["margin"] = static_cast<int64_t>(r.margin);
  if (d.slot >= 0) {
    ctx->saved_data["delayed_history"] = d.history;
    ctx->saved_data["delayed_scale"] = d.scale;
    ctx->saved_data["delayed_slot"] = d.slot;
  }
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return out.view(sizes);
}

variable_list fp8_backward_products(AutogradContext* ctx, const at::Tensor& grad, bool with_bias) {
  auto saved = ctx->get_saved_variables();
  const at::Tensor& weight = saved[2];
  Fp8Recipe r;
  r.hybrid = ctx->saved_data["hybrid"].toBool();
  r.scaling = static_cast<Fp8Scaling>(ctx->saved_data["scaling"].toInt());
  r.margin = static_cast<int>(ctx->saved_data["margin"].toInt());
  Delayed d;
  if (r.scaling == Fp8Scaling::Delayed) {
    d.history = ctx->saved_data["delayed_history"].toTensor();
    d.scale = ctx->saved_data["delayed_scale"].toTensor();
    d.slot = ctx->saved_data["delayed_slot"].toInt();
  }
  const fp8::Format gf = grad_format(r);
  const bool dx = ctx->needs_input_grad(0), dw = ctx->needs_input_grad(1);
  at::Tensor g = grad.reshape({-1, grad.size(-1)});
  variable_list out(with_bias ? 3 : 2);
  // dx = g · W takes g per row; dW = gᵀ · x takes gᵀ per row, g per column. Tensorwise, one
  // pass writes both layouts of g; rowwise, each its own scales.
  fp8::Layouts gq;
  if (dx || (dw && tensorwise(r)))
    gq = quantize(g, 1, gf, r, dx, dw && tensorwise(r), d, Fp8Operand::OutputGrad);
  if (dw && !tensorwise(r)) gq.transposed = quantize(g, 0, gf, r, false, true).transposed;
  if (dx) {
    // W per column (reduced over out): Wᵀ row-major is the column-major W the product takes;
    // forward's (one scale: the same values), else cast now (delayed: by the factor forward
    // cast it with, its amax forward's).
    const fp8::Quantized wt =
        saved[3].defined() ? fp8::Quantized{saved[3], saved[4]}
        : r.scaling == Fp8Scaling::Delayed
            ? fp8::quantize_layouts_by_factor(weight,
                                              d.scale.narrow(0, 3 * d.slot + 1, 1).reshape({}),
                                              fp8::Format::E4M3, false, true)
                  .transposed
            : quantize(weight, 0, fp8::Format::E4M3, r, false, true).transposed;
    const auto x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    out[0] = fp8::scaled_mm(gq.rows, as_right(wt), grad.scalar_type()).view(x_sizes);
  }
  if (dw) {
    // x per column (reduced over the tokens): xᵀ, kept from forward (tensorwise) or cast now.
    const fp8::Quantized xt =
        tensorwise(r) ? fp8::Quantized{saved[0], saved[1]}
                      : quantize(saved[0], 0, fp8::Format::E4M3, r, false, true).transposed;
    // Into the weight's destination where it has one; put off to W inside a split backward
    // (ops/deferred_grads.h).
    auto product = [weight, a = gq.transposed, b = as_right(xt), type = weight.scalar_type()] {
      const bool written =
          ops::write_grad_into(weight, weight.sizes(), at::empty({0}, weight.options()),
                               [&](at::Tensor slot, bool accumulate) {
                                 at::Tensor p = fp8::scaled_mm(a, b, type);
                                 if (accumulate)
                                   slot.add_(p);
                                 else
                                   slot.copy_(p);
                               });
      return written ? at::Tensor() : fp8::scaled_mm(a, b, type);
    };
    if (!ops::defer_weight_grad(weight, product)) out[1] = product();
  }
  if (with_bias && ctx->needs_input_grad(2)) out[2] = g.sum(0);
  return out;
}

struct Fp8LinearWithBias : torch::autograd::Function<Fp8LinearWithBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const Fp8Recipe& r, const Delayed& d) {
    return forward_and_save(ctx, x, weight, bias, r, d);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list g = fp8_backward_products(ctx, grads[0], true);
    g.resize(g.size() + 2);  // the recipe, the delayed state
    return g;
  }
};

struct Fp8LinearNoBias : torch::autograd::Function<Fp8LinearNoBias> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const Fp8Recipe& r, const Delayed& d) {
    return forward_and_save(ctx, x, weight, at::Tensor(), r, d);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list g = fp8_backward_products(ctx, grads[0], false);
    g.resize(g.size() + 2);
    return g;
  }
};

}  // namespace

Fp8Autocast::Fp8Autocast(std::optional<Fp8Recipe> recipe, Fp8MetaImpl* meta) : saved_(tl_scope) {
  tl_scope = {recipe, meta, 0};
}

Fp8Autocast::~Fp8Autocast() {
  tl_scope = saved_;
}

Fp8WeightCastsNotKept::Fp8WeightCastsNotKept() : saved_(tl_weight_casts_not_kept) {
  tl_weight_casts_not_kept = true;
}

Fp8WeightCastsNotKept::~Fp8WeightCastsNotKept() {
  tl_weight_casts_not_kept = saved_;
}

void check_fp8_usable(const c10::Device& device, bool fp16) {
  if (fp16)
    throw fp8::Fp8Error(
        "fp8 with fp16: FP8 training keeps the parameters in bf16; enable bf16 in the "
        "ds_config (\"bf16\": {\"enabled\": true}) instead of fp16");
#ifdef DSCPP_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
    if (p->major * 10 + p->minor < 89)
      throw fp8::Fp8Error(fmt::format(
          "fp8: {} (compute capability {}.{}) has no FP8 tensor cores; fp8 needs 8.9 (Ada) or "
          "9.0 (Hopper) and later: leave the model config's fp8 out on this GPU",
          p->name, p->major, p->minor));
  }
#endif
  (void)device;
}

const Fp8Recipe* current_fp8_recipe() {
  return tl_scope.recipe ? &*tl_scope.recipe : nullptr;
}

bool fp8_applies(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.is_floating_point() || weight.dim() != 2 || x.numel() == 0) return false;
  if (!x.is_cuda()) return true;
  // _scaled_mm on the GPU: every dimension of both operands a multiple of 16.
  const int64_t rows = x.numel() / x.size(-1);
  return rows % 16 == 0 && weight.size(0) % 16 == 0 && weight.size(1) % 16 == 0;
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const Fp8Recipe& recipe) {
  RECORD_FUNCTION("dscpp::fp8_linear", std::vector<c10::IValue>({x, weight, bias}));
  Delayed d;
  if (recipe.scaling == Fp8Scaling::Delayed) {
    Fp8MetaImpl* meta = tl_scope.meta;
    if (!meta)
      throw fp8::Fp8Error(
          "fp8_recipe \"delayed\": a product made in an Fp8Autocast scope without its module's "
          "Fp8Meta, where the amax history lives (nn/fp8_meta.h)");
    d.slot = tl_scope.next_slot++;
    if (d.slot >= meta->products())
      throw fp8::Fp8Error(fmt::format(
          "fp8_recipe \"delayed\": the module's Fp8Meta has room for {} products, and its "
          "forward made a {}th",
          meta->products(), d.slot + 1));
    d.history = meta->amax_history;
    d.scale = meta->scale;
  }
  return bias.defined() ? Fp8LinearWithBias::apply(x, weight, bias, recipe, d)
                        : Fp8LinearNoBias::apply(x, weight, recipe, d);
}

}  // namespace dscpp::nn
