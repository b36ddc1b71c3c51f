// Token dispatch between the router and the experts (Megatron-Core's token dispatcher). The
// hand-over format of every dispatcher is expert-major rows: the routed tokens sorted by
// expert, [N, H] with N >= sum(counts), with counts int64 [experts]; rows past sum(counts) are
// padding, which the experts may compute on or not and combine ignores. permute_tokens makes
// it from the tokens and their routing (kept routes only, each expert's rows in token order);
// unpermute_tokens weighs expert outputs by their combine weights and sums them back into
// their tokens (dropped routes give zero; the residual path is the caller's). Both are
// differentiable: ops::moe_permute / moe_unpermute (ops/moe_permute.h), CUDA kernels for
// bf16/fp16/fp32 tokens on a GPU, where nothing waits on the host and N = S * k (the kept
// routes' count is known there only on the device), ATen's index_select / index_add elsewhere,
// where N = sum(counts).
//
// With a capacity C (the router's, Routing::capacity >= 0), permute_tokens_padded lays the
// kept routes in DeepSpeed's fixed [E, C, H] layout instead: expert e's rows are slots
// [e*C, (e+1)*C), its kept routes first in the same order, then zero rows; computed on the
// device from the routing alone (no count is read on the host, on any device), for the
// fixed-size exchange.
//
// An expert-parallel dispatcher exchanges the permuted rows over its group (all-to-all:
// experts are laid on ranks in contiguous blocks) between the two; LocalTokenDispatcher is
// ep_size = 1, where the exchange is the identity.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

#include "dscpp/nn/moe/router.h"
#include "dscpp/ops/moe_permute.h"

namespace dscpp::nn::moe {

struct PermutedTokens {
  ops::MoePermutation permutation;  // rows [N, H] expert-major, counts int64 [experts], maps
  at::Tensor weights;               // fp32 [S, k] the routing's combine weights
  int64_t num_tokens = 0;
};

// use_kernels false: the ATen path on every device (the comparison of tests and benchmarks).
PermutedTokens permute_tokens(const at::Tensor& tokens, const Routing& routing,
                              bool use_kernels = true);
// expert_rows [N', H'] in the permuted order, sum(counts) <= N' <= N -> [num_tokens, H'] in
// expert_rows' dtype (the weighted sum accumulates in fp32, as DeepSpeed's _sparse_decode).
at::Tensor unpermute_tokens(const at::Tensor& expert_rows, const PermutedTokens& permuted,
                            bool use_kernels = true);
// The [E * C, H] layout above (routing.capacity = C >= 0); unpermute_tokens takes it.
PermutedTokens permute_tokens_padded(const at::Tensor& tokens, const Routing& routing);

// Rows for this rank's local experts and their counts.
struct ExpertInput {
  // [N, H], N >= sum(counts): rows past sum(counts) are padding. The padded layout:
  // [E_l, R, H], R rows for each local expert, its padding rows zero anywhere among them.
  at::Tensor rows;
  at::Tensor counts;  // int64 [num_local_experts]; undefined in the padded layout
};

// Work that does not depend on an exchange, run while the exchange is on the wire (and its
// backward while the gradient's is): a dispatcher runs it once, inside dispatch or combine
// (one without an exchange, at once). Empty: nothing.
using Beside = std::function<void()>;

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // tokens [S, H] and their routing -> the local experts' rows. Keeps what combine needs.
  virtual ExpertInput dispatch(const at::Tensor& tokens, const Routing& routing,
                               const Beside& beside = {}) = 0;
  // The local experts' outputs (rows in dispatch's order and layout, at least sum(counts) of
  // them) -> [S, H'].
  virtual at::Tensor combine(const at::Tensor& expert_rows, const Beside& beside = {}) = 0;
};

// How many times this process has read routed counts on the host (the variable-size
// exchange's splits, the cloned experts' row ranges): a debug counter, so that tests can
// show that a path reads none.
int64_t host_count_reads();
void note_host_count_read();

class LocalTokenDispatcher : public TokenDispatcher {
 public:
  explicit LocalTokenDispatcher(bool use_kernels = true) : use_kernels_(use_kernels) {}
  ExpertInput dispatch(const at::Tensor& tokens, const Routing& routing,
                       const Beside& beside = {}) override;
  at::Tensor combine(const at::Tensor& expert_rows, const Beside& beside = {}) override;

 private:
  bool use_kernels_;
  PermutedTokens permuted_;
};

}  // namespace dscpp::nn::moe
