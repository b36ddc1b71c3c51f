// The tiled computation (tiled_compute.h).
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/tiled_compute.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <utility>

#include "dscpp/error.h"
#include "dscpp/ops/deferred_grads.h"

namespace dscpp::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FnHolder : torch::CustomClassHolder {
  explicit FnHolder(TiledFn f) : fn(std::move(f)) {}
  TiledFn fn;
};

// The slices of n along dim: tile t is [begin, end).
std::pair<int64_t, int64_t> slice_of(int64_t t, int64_t tiles, int64_t n) {
  const int64_t per = (n + tiles - 1) / tiles;
  return {std::min(n, t * per), std::min(n, (t + 1) * per)};
}

struct TiledCompute : torch::autograd::Function<TiledCompute> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                            int64_t dim, int64_t tiles, c10::intrusive_ptr<FnHolder> holder) {
    const std::vector<at::Tensor> ps(params.begin(), params.end());
    std::vector<at::Tensor> outs;
    for (int64_t t = 0; t < tiles; ++t) {
      const auto [begin, end] = slice_of(t, tiles, x.size(dim));
      if (begin < end) outs.push_back(holder->fn(x.narrow(dim, begin, end - begin), ps));
    }
    variable_list saved = {x};
    saved.insert(saved.end(), ps.begin(), ps.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["tiles"] = tiles;
    ctx->saved_data["fn"] = at::IValue::make_capsule(std::move(holder));
    return at::cat(outs, dim);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (ops::capturing())
      throw Error(
          "tiled_compute: a tiled MLP (tiled_mlp_shards) cannot run under the zero-bubble "
          "schedules' split backward; use 1F1B or interleaved, or tiled_mlp_shards 1");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const int64_t dim = ctx->saved_data["dim"].toInt(), tiles = ctx->saved_data["tiles"].toInt();
    const auto& fn =
        c10::static_intrusive_pointer_cast<FnHolder>(ctx->saved_data["fn"].toCapsule())->fn;
    const int64_t n = static_cast<int64_t>(saved.size()) - 1;
    std::vector<at::Tensor> sums(n);
    at::Tensor dx = x.requires_grad() ? at::empty_like(x) : at::Tensor();
    at::AutoGradMode grad_on(true);
    for (int64_t t = 0; t < tiles; ++t) {
      const auto [begin, end] = slice_of(t, tiles, x.size(dim));
      if (begin == end) break;
      const at::Tensor slice = x.narrow(dim, begin, end - begin).detach().requires_grad_();
      std::vector<at::Tensor> aliases;
      variable_list inputs = {slice};
      for (int64_t i = 0; i < n; ++i) {
        const at::Tensor& p = saved[static_cast<size_t>(i + 1)];
        aliases.push_back(p.detach().requires_grad_(p.requires_grad()));
        if (p.requires_grad()) inputs.push_back(aliases.back());
      }
      const at::Tensor y = fn(slice, aliases);
      const variable_list g = torch::autograd::grad(
          {y}, inputs, {grads[0].narrow(dim, begin, end - begin)}, /*retain_graph=*/false,
          /*create_graph=*/false, /*allow_unused=*/true);
      if (dx.defined()) dx.narrow(dim, begin, end - begin).copy_(g[0]);
      size_t k = 1;
      for (int64_t i = 0; i < n; ++i) {
        if (!saved[static_cast<size_t>(i + 1)].requires_grad()) continue;
        const at::Tensor& gi = g[k++];
        if (!gi.defined()) continue;
        at::Tensor& s = sums[static_cast<size_t>(i)];
        const auto acc = gi.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
        s = s.defined() ? s.add_(gi.to(acc)) : gi.to(acc).clone();
      }
    }
    variable_list out = {dx};
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor& s = sums[static_cast<size_t>(i)];
      out.push_back(s.defined() ? s.to(saved[static_cast<size_t>(i + 1)].scalar_type())
                                : at::Tensor());
    }
    out.insert(out.end(), {at::Tensor(), at::Tensor(), at::Tensor()});
    return out;
  }
};

}  // namespace

at::Tensor tiled_compute(const TiledFn& fn, const at::Tensor& x,
                         const std::vector<at::Tensor>& params, int64_t dim, int64_t tiles) {
  if (tiles <= 1 || x.size(dim) < tiles) return fn(x, params);
  return TiledCompute::apply(x, at::TensorList(params), dim, tiles,
                             c10::make_intrusive<FnHolder>(fn));
}

}  // namespace dscpp::nn
