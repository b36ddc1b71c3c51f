// Token dispatch between the router and the experts (Megatron-Core's token dispatcher). The
// hand-over format of every dispatcher is expert-major rows: the routed tokens sorted by
// expert, [sum(counts), H], with counts int64 [experts]. permute_tokens makes it from the
// tokens and their routing (kept routes only, each expert's rows in token order);
// unpermute_tokens weighs expert outputs by their combine weights and sums them back into
// their tokens (dropped routes give zero; the residual path is the caller's). Both are
// differentiable (index_select / index_add).
//
// An expert-parallel dispatcher exchanges the permuted rows over its group (all-to-all by
// counts: experts are laid on ranks in contiguous blocks) between the two; LocalTokenDispatcher
// is ep_size = 1, where the exchange is the identity.
#pragma once

#include <ATen/core/Tensor.h>

#include "dscpp/nn/moe/router.h"

namespace dscpp::nn::moe {

struct PermutedTokens {
  at::Tensor rows;         // [R, H] the routed tokens, expert-major
  at::Tensor counts;       // int64 [experts] rows per expert
  at::Tensor token_index;  // int64 [R] the token each row came from
  at::Tensor weights;      // fp32 [R] its combine weight
  int64_t num_tokens = 0;
};

PermutedTokens permute_tokens(const at::Tensor& tokens, const Routing& routing);
// expert_rows [R, H'] in the permuted order -> [num_tokens, H'] in expert_rows' dtype (the
// weighted sum accumulates in fp32, as DeepSpeed's _sparse_decode).
at::Tensor unpermute_tokens(const at::Tensor& expert_rows, const PermutedTokens& permuted);

// Rows for this rank's local experts and their counts.
struct ExpertInput {
  at::Tensor rows;    // [sum(counts), H]
  at::Tensor counts;  // int64 [num_local_experts]
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // tokens [S, H] and their routing -> the local experts' rows. Keeps what combine needs.
  virtual ExpertInput dispatch(const at::Tensor& tokens, const Routing& routing) = 0;
  // The local experts' outputs (rows in dispatch's order) -> [S, H'].
  virtual at::Tensor combine(const at::Tensor& expert_rows) = 0;
};

class LocalTokenDispatcher : public TokenDispatcher {
 public:
  ExpertInput dispatch(const at::Tensor& tokens, const Routing& routing) override;
  at::Tensor combine(const at::Tensor& expert_rows) override;

 private:
  PermutedTokens permuted_;
};

}  // namespace dscpp::nn::moe
