// moe_topk_route: argument checks, then the CUDA kernels (moe_router.cu) behind an autograd
// Function where they apply, and the ATen composition (differentiable by ATen's own autograd)
// everywhere else.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/ops/moe_router.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/error.h"

#ifdef DSCPP_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dscpp/ops/kernel_launch.h"
#endif

namespace dscpp::ops {
namespace {

void check_router_args(const at::Tensor& scores, const at::Tensor& bias, int64_t k) {
  if (!scores.defined() || scores.dim() != 2 || scores.scalar_type() != at::kFloat)
    throw Error(fmt::format("moe_topk_route: expected fp32 scores [tokens, experts], got {}",
                            scores.defined()
                                ? fmt::format("{} [{}]", c10::toString(scores.scalar_type()),
                                              fmt::join(scores.sizes(), ", "))
                                : std::string("undefined")));
  const int64_t e = scores.size(1);
  if (k < 1 || k > e)
    throw Error(fmt::format("moe_topk_route: k must be in [1, {}] (the experts), got {}", e, k));
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != e || bias.scalar_type() != at::kFloat ||
                         bias.device() != scores.device()))
    throw Error(fmt::format("moe_topk_route: expected an fp32 bias [{}] on {}, got [{}] {} on {}",
                            e, scores.device().str(), fmt::join(bias.sizes(), ", "),
                            c10::toString(bias.scalar_type()), bias.device().str()));
}

MoeTopK route_aten(const at::Tensor& scores, const at::Tensor& bias, int64_t k, bool normalize,
                   double scale) {
  at::Tensor sel = scores.detach();
  if (bias.defined()) sel = sel + bias;
  MoeTopK t;
  t.indices = std::get<1>(sel.topk(k, 1));
  at::Tensor w = scores.gather(1, t.indices);
  if (normalize) w = w / at::clamp_min(w.sum(1, true), std::numeric_limits<float>::epsilon());
  t.weights = scale != 1.0 ? w * scale : w;
  // scatter_add, not bincount: on a GPU bincount reads the largest index on the host.
  const at::Tensor flat = t.indices.reshape({-1});
  t.counts = at::zeros({scores.size(1)}, flat.options()).scatter_add_(0, flat, at::ones_like(flat));
  return t;
}

#ifdef DSCPP_CUDA
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

struct TopKFunction : torch::autograd::Function<TopKFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& scores,
                               const std::optional<at::Tensor>& bias, int64_t k, bool normalize,
                               double scale) {
    const c10::cuda::CUDAGuard guard(scores.device());
    const at::Tensor s = scores.contiguous();
    const at::Tensor b = bias ? bias->contiguous() : at::Tensor();
    const int64_t tokens = s.size(0), experts = s.size(1);
    at::Tensor indices = at::empty({tokens, k}, s.options().dtype(at::kLong));
    at::Tensor weights = at::empty({tokens, k}, s.options());
    at::Tensor counts = at::zeros({experts}, s.options().dtype(at::kLong));
    cuda::launch_moe_topk_forward(
        s.const_data_ptr<float>(), b.defined() ? b.const_data_ptr<float>() : nullptr, tokens,
        experts, k, normalize, static_cast<float>(scale), indices.mutable_data_ptr<int64_t>(),
        weights.mutable_data_ptr<float>(), counts.mutable_data_ptr<int64_t>(), stream_of(s));
    ctx->mark_non_differentiable({indices, counts});
    ctx->save_for_backward({s, indices});
    ctx->saved_data["normalize"] = normalize;
    ctx->saved_data["scale"] = scale;
    return {indices, weights, counts};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &s = saved[0], &indices = saved[1];
    const c10::cuda::CUDAGuard guard(s.device());
    const at::Tensor g = grads[1].to(at::kFloat).contiguous();
    at::Tensor d = at::empty_like(s);
    cuda::launch_moe_topk_backward(g.const_data_ptr<float>(), s.const_data_ptr<float>(),
                                   indices.const_data_ptr<int64_t>(), s.size(0), s.size(1),
                                   indices.size(1), ctx->saved_data["normalize"].toBool(),
                                   static_cast<float>(ctx->saved_data["scale"].toDouble()),
                                   d.mutable_data_ptr<float>(), stream_of(s));
    return {d, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

bool moe_topk_route_uses_kernels(const at::Tensor& scores, int64_t k) {
#ifdef DSCPP_CUDA
  return scores.defined() && scores.is_cuda() && scores.scalar_type() == at::kFloat &&
         scores.dim() == 2 && scores.size(1) <= kMoeTopKMaxExperts && k <= kMoeTopKMaxK;
#else
  (void)scores;
  (void)k;
  return false;
#endif
}

MoeTopK moe_topk_route(const at::Tensor& scores, const at::Tensor& bias, int64_t k, bool normalize,
                       double scale, bool allow_kernels) {
  RECORD_FUNCTION("dscpp::moe_topk_route", std::vector<c10::IValue>({scores}));
  check_router_args(scores, bias, k);
#ifdef DSCPP_CUDA
  if (allow_kernels && moe_topk_route_uses_kernels(scores, k)) {
    // An optional, not an undefined tensor: autograd's Function takes every tensor argument
    // for an input with a device.
    const variable_list out =
        TopKFunction::apply(scores, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                            k, normalize, scale);
    return {out[0], out[1], out[2]};
  }
#else
  (void)allow_kernels;
#endif
  return route_aten(scores, bias, k, normalize, scale);
}

}  // namespace dscpp::ops
