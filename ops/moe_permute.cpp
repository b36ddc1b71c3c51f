// moe_permute / moe_unpermute: argument checks, then the CUDA kernels (moe_permute.cu) behind
// autograd Functions where they apply, and the ATen composition (differentiable by ATen's own
// autograd) everywhere else.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/ops/moe_permute.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <string>
#include <vector>

#include "dscpp/error.h"

#ifdef DSCPP_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "dscpp/ops/kernel_dtype.h"
#include "dscpp/ops/kernel_launch.h"
#endif

namespace dscpp::ops {
namespace {

std::string sizes_of(const at::Tensor& t) {
  return t.defined() ? fmt::format("[{}]", fmt::join(t.sizes(), ", ")) : "undefined";
}

void check_permute_args(const at::Tensor& tokens, const at::Tensor& indices, const at::Tensor& kept,
                        int64_t num_experts) {
  if (!tokens.defined() || !indices.defined() || !kept.defined() || tokens.dim() != 2 ||
      indices.dim() != 2 || kept.sizes() != indices.sizes() || indices.size(0) != tokens.size(0))
    throw Error(fmt::format(
        "moe_permute: expected tokens [S, H], indices and kept [S, k], got tokens {}, indices "
        "{}, kept {}",
        sizes_of(tokens), sizes_of(indices), sizes_of(kept)));
  if (indices.scalar_type() != at::kLong || kept.scalar_type() != at::kBool)
    throw Error(fmt::format("moe_permute: expected int64 indices and bool kept, got {} and {}",
                            c10::toString(indices.scalar_type()),
                            c10::toString(kept.scalar_type())));
  if (indices.device() != tokens.device() || kept.device() != tokens.device())
    throw Error(fmt::format("moe_permute: tokens on {}, indices on {}, kept on {}",
                            tokens.device().str(), indices.device().str(), kept.device().str()));
  if (num_experts < 1)
    throw Error("moe_permute: num_experts must be >= 1, got " + std::to_string(num_experts));
}

void check_unpermute_args(const at::Tensor& rows, const at::Tensor& weights,
                          const MoePermutation& p) {
  if (!rows.defined() || rows.dim() != 2 || !p.row_route.defined() || !p.route_dest.defined() ||
      rows.size(0) > p.row_route.size(0))
    throw Error(fmt::format(
        "moe_unpermute: expected expert rows [N', H'] with N' at most the permutation's {} "
        "rows, got {}",
        p.row_route.defined() ? p.row_route.size(0) : 0, sizes_of(rows)));
  if (!weights.defined() || weights.dim() != 2 || weights.numel() != p.route_dest.numel() ||
      weights.scalar_type() != at::kFloat)
    throw Error(fmt::format(
        "moe_unpermute: expected fp32 weights [S, k] of the permutation's {} routes, got {} {}",
        p.route_dest.numel(), sizes_of(weights),
        weights.defined() ? c10::toString(weights.scalar_type()) : ""));
  if (rows.device() != p.row_route.device() || weights.device() != rows.device())
    throw Error(fmt::format("moe_unpermute: expert rows on {}, weights on {}, permutation on {}",
                            rows.device().str(), weights.device().str(),
                            p.row_route.device().str()));
}

// The ATen path: the kept routes on the host (nonzero), a stable sort by expert.
MoePermutation permute_aten(const at::Tensor& tokens, const at::Tensor& indices,
                            const at::Tensor& kept, int64_t num_experts) {
  const int64_t k = indices.size(1);
  const at::Tensor route = kept.reshape({-1}).nonzero().squeeze(1);
  const at::Tensor expert = indices.reshape({-1}).index_select(0, route);
  if (expert.numel() > 0 &&
      (expert.min().item<int64_t>() < 0 || expert.max().item<int64_t>() >= num_experts))
    throw Error(fmt::format("moe_permute: a kept route's expert is outside [0, {})", num_experts));
  const at::Tensor order =
      std::get<1>(at::sort(expert, /*stable=*/std::optional<bool>(true), 0, false));
  MoePermutation p;
  p.row_route = route.index_select(0, order);
  p.route_dest = at::full({indices.numel()}, -1, indices.options())
                     .scatter_(0, p.row_route, at::arange(p.row_route.numel(), indices.options()));
  p.counts = at::bincount(expert, {}, num_experts);
  p.rows = tokens.index_select(0, p.row_route.div(k, "floor"));
  return p;
}

at::Tensor unpermute_aten(const at::Tensor& rows, const at::Tensor& weights,
                          const MoePermutation& p) {
  const int64_t k = weights.size(1);
  at::Tensor route = p.row_route.narrow(0, 0, rows.size(0));
  at::Tensor y = rows.to(at::kFloat);
  if (p.padded) {
    // Padding rows may hold NaN: replaced by zeros before the product, so that neither the
    // output nor the weights' gradient (0 * NaN) sees them; they count towards token 0.
    y = at::where(route.ge(0).unsqueeze(1), y, 0);
    route = route.clamp_min(0);
  }
  at::Tensor weighted = y * weights.reshape({-1}).index_select(0, route).unsqueeze(1);
  at::Tensor out = at::zeros({weights.size(0), rows.size(1)}, weighted.options());
  return out.index_add(0, route.div(k, "floor"), weighted).to(rows.scalar_type());
}

#ifdef DSCPP_CUDA
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// sum over a token's rows (weights undefined: 1) -> [tokens, hidden] in in's dtype.
at::Tensor combine(const at::Tensor& in, const at::Tensor& weights, const at::Tensor& route_dest,
                   int64_t tokens, int64_t k) {
  const at::Tensor x = in.contiguous();
  at::Tensor out = at::empty({tokens, x.size(1)}, x.options());
  cuda::launch_moe_combine(
      x.const_data_ptr(), weights.defined() ? weights.const_data_ptr<float>() : nullptr,
      route_dest.const_data_ptr<int64_t>(), x.size(0), tokens, x.size(1), k,
      *cuda::kernel_dtype(x.scalar_type()), out.mutable_data_ptr(), stream_of(x));
  return out;
}

struct PermuteFunction : torch::autograd::Function<PermuteFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& tokens,
                               const at::Tensor& indices, const at::Tensor& kept,
                               int64_t num_experts) {
    const c10::cuda::CUDAGuard guard(tokens.device());
    const at::Tensor x = tokens.contiguous(), ind = indices.contiguous(), kp = kept.contiguous();
    const int64_t routes = ind.numel(), k = ind.size(1);
    const auto long_opts = ind.options();
    at::Tensor counts = at::empty({num_experts}, long_opts);
    at::Tensor route_dest = at::empty({routes}, long_opts);
    at::Tensor row_route = at::full({routes}, -1, long_opts);  // -1: padding, until placed
    at::Tensor workspace =
        at::empty({cuda::moe_permute_workspace(routes, num_experts)}, long_opts.dtype(at::kInt));
    const cudaStream_t stream = stream_of(x);
    cuda::launch_moe_permute_routes(
        ind.const_data_ptr<int64_t>(), kp.const_data_ptr<bool>(), routes, num_experts,
        workspace.mutable_data_ptr<int>(), counts.mutable_data_ptr<int64_t>(),
        route_dest.mutable_data_ptr<int64_t>(), row_route.mutable_data_ptr<int64_t>(), stream);
    at::Tensor rows = at::empty({routes, x.size(1)}, x.options());
    cuda::launch_moe_gather_rows(x.const_data_ptr(), row_route.const_data_ptr<int64_t>(), routes,
                                 x.size(1), k, x.element_size(), rows.mutable_data_ptr(), stream);
    ctx->mark_non_differentiable({counts, route_dest, row_route});
    ctx->save_for_backward({route_dest});
    ctx->saved_data["tokens"] = x.size(0);
    ctx->saved_data["k"] = k;
    return {rows, counts, route_dest, row_route};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor d_tokens;
    if (ctx->needs_input_grad(0)) {
      const c10::cuda::CUDAGuard guard(grads[0].device());
      // Each token's rows summed in fp32 (index_select's backward would add them in bf16).
      d_tokens = combine(grads[0], at::Tensor(), saved[0], ctx->saved_data["tokens"].toInt(),
                         ctx->saved_data["k"].toInt());
    }
    return {d_tokens, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct UnpermuteFunction : torch::autograd::Function<UnpermuteFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& weights,
                            const at::Tensor& route_dest, const at::Tensor& row_route) {
    const c10::cuda::CUDAGuard guard(rows.device());
    const at::Tensor y = rows.contiguous(), w = weights.contiguous();
    ctx->save_for_backward({y, w, row_route});
    return combine(y, w, route_dest, w.size(0), w.size(1));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &y = saved[0], &w = saved[1], &row_route = saved[2];
    const c10::cuda::CUDAGuard guard(y.device());
    const at::Tensor g = grads[0].to(y.scalar_type()).contiguous();
    at::Tensor d_rows = at::empty_like(y);
    at::Tensor d_weights;
    if (ctx->needs_input_grad(1)) d_weights = at::zeros_like(w);  // dropped routes: 0
    cuda::launch_moe_unpermute_backward(
        g.const_data_ptr(), y.const_data_ptr(), w.const_data_ptr<float>(),
        row_route.const_data_ptr<int64_t>(), y.size(0), y.size(1), w.size(1),
        *cuda::kernel_dtype(y.scalar_type()), d_rows.mutable_data_ptr(),
        d_weights.defined() ? d_weights.mutable_data_ptr<float>() : nullptr, stream_of(y));
    return {ctx->needs_input_grad(0) ? d_rows : at::Tensor(), d_weights, at::Tensor(),
            at::Tensor()};
  }
};
#endif

}  // namespace

bool moe_permute_uses_kernels(const at::Tensor& tokens, int64_t num_experts) {
#ifdef DSCPP_CUDA
  return tokens.defined() && tokens.is_cuda() && cuda::kernel_dtype(tokens.scalar_type()) &&
         num_experts >= 1 && num_experts <= kMoePermuteMaxExperts;
#else
  (void)tokens;
  (void)num_experts;
  return false;
#endif
}

MoePermutation moe_permute(const at::Tensor& tokens, const at::Tensor& indices,
                           const at::Tensor& kept, int64_t num_experts, bool allow_kernels) {
  RECORD_FUNCTION("dscpp::moe_permute", std::vector<c10::IValue>({tokens, indices, kept}));
  check_permute_args(tokens, indices, kept, num_experts);
#ifdef DSCPP_CUDA
  if (allow_kernels && moe_permute_uses_kernels(tokens, num_experts)) {
    if (indices.numel() >= int64_t{0x7fffffff})
      throw Error("moe_permute: at most 2^31 - 1 routes, got " + std::to_string(indices.numel()));
    const variable_list out = PermuteFunction::apply(tokens, indices, kept, num_experts);
    return {out[0], out[1], out[3], out[2], /*padded=*/true};
  }
#else
  (void)allow_kernels;
#endif
  return permute_aten(tokens, indices, kept, num_experts);
}

MoePermutation moe_permute_padded(const at::Tensor& tokens, const at::Tensor& indices,
                                  const at::Tensor& kept, int64_t num_experts, int64_t capacity) {
  RECORD_FUNCTION("dscpp::moe_permute_padded", std::vector<c10::IValue>({tokens, indices, kept}));
  check_permute_args(tokens, indices, kept, num_experts);
  if (capacity < 0)
    throw Error("moe_permute_padded: capacity must be >= 0, got " + std::to_string(capacity));
  const int64_t k = indices.size(1), routes = indices.numel(), slots = num_experts * capacity;
  const auto long_opts = indices.options();
  const at::Tensor expert = indices.reshape({-1});
  // Dropped routes (and kept ones outside the experts) sort last, under key num_experts.
  const at::Tensor key =
      at::where(kept.reshape({-1}).logical_and(expert.ge(0)).logical_and(expert.lt(num_experts)),
                expert, num_experts);
  const at::Tensor order =
      std::get<1>(at::sort(key, /*stable=*/std::optional<bool>(true), 0, false));
  const at::Tensor sorted = key.index_select(0, order);
  // Per-key counts by scatter_add, not bincount: bincount sizes its output from a host read.
  const at::Tensor per_key =
      at::zeros({num_experts + 1}, long_opts).scatter_add_(0, key, at::ones_like(key));
  const at::Tensor starts = per_key.cumsum(0) - per_key;  // each key's first sorted position
  const at::Tensor pos = at::arange(routes, long_opts) - starts.index_select(0, sorted);
  const at::Tensor placed = sorted.lt(num_experts).logical_and(pos.lt(capacity));
  // Routes left out all go to one spare slot past the layout, cut off below.
  const at::Tensor slot = at::where(placed, sorted * capacity + pos, slots);
  const at::Tensor minus_one = at::full({}, -1, long_opts);
  MoePermutation p;
  p.route_dest =
      at::full({routes}, -1, long_opts).scatter_(0, order, at::where(placed, slot, minus_one));
  p.row_route = at::full({slots + 1}, -1, long_opts)
                    .scatter_(0, slot, at::where(placed, order, minus_one))
                    .narrow(0, 0, slots);
  p.counts = per_key.narrow(0, 0, num_experts).clamp_max(capacity);
  const at::Tensor filled = p.row_route.ge(0).unsqueeze(1);
  p.rows = at::where(filled, tokens.index_select(0, p.row_route.clamp_min(0).div(k, "floor")), 0);
  p.padded = true;
  return p;
}

at::Tensor moe_unpermute(const at::Tensor& expert_rows, const at::Tensor& weights,
                         const MoePermutation& p, bool allow_kernels) {
  RECORD_FUNCTION("dscpp::moe_unpermute", std::vector<c10::IValue>({expert_rows, weights}));
  check_unpermute_args(expert_rows, weights, p);
#ifdef DSCPP_CUDA
  if (allow_kernels && expert_rows.is_cuda() && cuda::kernel_dtype(expert_rows.scalar_type()))
    return UnpermuteFunction::apply(expert_rows, weights, p.route_dest, p.row_route);
#else
  (void)allow_kernels;
#endif
  return unpermute_aten(expert_rows, weights, p);
}

}  // namespace dscpp::ops
