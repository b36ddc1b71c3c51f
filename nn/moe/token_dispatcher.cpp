// Permute / unpermute and the single-rank dispatcher: see token_dispatcher.h.
#include "dscpp/nn/moe/token_dispatcher.h"

#include <atomic>
#include <string>

#include "dscpp/error.h"

namespace dscpp::nn::moe {

namespace {
std::atomic<int64_t> count_reads{0};
}  // namespace

int64_t host_count_reads() {
  return count_reads.load();
}

void note_host_count_read() {
  ++count_reads;
}

PermutedTokens permute_tokens(const at::Tensor& tokens, const Routing& routing, bool use_kernels) {
  if (!tokens.defined() || tokens.dim() != 2 || !routing.indices.defined() ||
      tokens.size(0) != routing.indices.size(0))
    throw dscpp::Error("permute_tokens: tokens must be [S, H] with S = the routed tokens (" +
                       std::to_string(routing.indices.defined() ? routing.indices.size(0) : 0) +
                       ")");
  PermutedTokens p;
  p.permutation =
      ops::moe_permute(tokens, routing.indices, routing.kept, routing.num_experts, use_kernels);
  p.weights = routing.weights;
  p.num_tokens = tokens.size(0);
  return p;
}

at::Tensor unpermute_tokens(const at::Tensor& expert_rows, const PermutedTokens& p,
                            bool use_kernels) {
  return ops::moe_unpermute(expert_rows, p.weights, p.permutation, use_kernels);
}

PermutedTokens permute_tokens_padded(const at::Tensor& tokens, const Routing& routing) {
  if (!tokens.defined() || tokens.dim() != 2 || !routing.indices.defined() ||
      tokens.size(0) != routing.indices.size(0) || routing.capacity < 0)
    throw dscpp::Error("permute_tokens_padded: tokens must be [S, H] with S = the routed tokens (" +
                       std::to_string(routing.indices.defined() ? routing.indices.size(0) : 0) +
                       ") and the routing a capacity (got " + std::to_string(routing.capacity) +
                       ")");
  PermutedTokens p;
  p.permutation = ops::moe_permute_padded(tokens, routing.indices, routing.kept,
                                          routing.num_experts, routing.capacity);
  p.weights = routing.weights;
  p.num_tokens = tokens.size(0);
  return p;
}

ExpertInput LocalTokenDispatcher::dispatch(const at::Tensor& tokens, const Routing& routing,
                                           const Beside& beside) {
  permuted_ = permute_tokens(tokens, routing, use_kernels_);
  if (beside) beside();
  return {permuted_.permutation.rows, permuted_.permutation.counts};
}

at::Tensor LocalTokenDispatcher::combine(const at::Tensor& expert_rows, const Beside& beside) {
  if (beside) beside();
  at::Tensor out = unpermute_tokens(expert_rows, permuted_, use_kernels_);
  permuted_ = {};
  return out;
}

}  // namespace dscpp::nn::moe
