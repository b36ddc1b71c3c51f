// Permute / unpermute and the single-rank dispatcher: see token_dispatcher.h.
#include "dscpp/nn/moe/token_dispatcher.h"

#include <ATen/ATen.h>

#include "dscpp/error.h"

namespace dscpp::nn::moe {

PermutedTokens permute_tokens(const at::Tensor& tokens, const Routing& routing) {
  if (tokens.dim() != 2 || tokens.size(0) != routing.indices.size(0))
    throw dscpp::Error("permute_tokens: tokens must be [S, H] with S = the routed tokens (" +
                       std::to_string(routing.indices.size(0)) + ")");
  const int64_t k = routing.indices.size(1);
  at::Tensor kept = routing.kept.reshape({-1});
  at::Tensor route = kept.nonzero().squeeze(1);  // flat (token, choice) routes kept
  at::Tensor expert = routing.indices.reshape({-1}).index_select(0, route);
  at::Tensor order = std::get<1>(at::sort(expert, /*stable=*/std::optional<bool>(true), 0, false));
  at::Tensor sorted_route = route.index_select(0, order);
  PermutedTokens p;
  p.num_tokens = tokens.size(0);
  p.token_index = sorted_route.div(k, "floor");
  p.weights = routing.weights.reshape({-1}).index_select(0, sorted_route);
  p.counts = at::bincount(expert, {}, routing.num_experts);
  p.rows = tokens.index_select(0, p.token_index);
  return p;
}

at::Tensor unpermute_tokens(const at::Tensor& expert_rows, const PermutedTokens& p) {
  at::Tensor weighted = expert_rows.to(at::kFloat) * p.weights.unsqueeze(1);
  at::Tensor out = at::zeros({p.num_tokens, expert_rows.size(1)}, weighted.options());
  return out.index_add(0, p.token_index, weighted).to(expert_rows.scalar_type());
}

ExpertInput LocalTokenDispatcher::dispatch(const at::Tensor& tokens, const Routing& routing) {
  permuted_ = permute_tokens(tokens, routing);
  return {permuted_.rows, permuted_.counts};
}

at::Tensor LocalTokenDispatcher::combine(const at::Tensor& expert_rows) {
  at::Tensor out = unpermute_tokens(expert_rows, permuted_);
  permuted_ = {};
  return out;
}

}  // namespace dscpp::nn::moe
