// The expert-parallel exchange between the permuted tokens and the local experts. Input: this
// rank's routed rows sorted expert-major for the GLOBAL experts, [N, H] with N >= sum(counts)
// (rows past sum(counts) are padding, not sent), with counts int64 [num_experts] (the
// dispatchers' hand-over format). The experts lie on the
// expert-parallel group in contiguous blocks: group rank r owns experts [r*E_l, (r+1)*E_l),
// E_l = num_experts / ep_size. dispatch first exchanges the counts (an all-to-all of the
// [ep, E_l] counts), then the rows (a variable-size all-to-all), and regroups what arrived
// local-expert-major (within an expert, by source rank), ready for one grouped GEMM.
// combine is the exact reverse, back to this rank's rows in their dispatched order.
// Both are differentiable: the backward of each all-to-all is the reverse all-to-all with the
// same splits, and the regrouping is a split and a concatenation. The counts are read on the
// host once per dispatch (the splits of the all-to-all need them: on a GPU a synchronisation,
// as dropless routing needs). ep_group null or of size one: no communication (identity).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/nn/moe/token_dispatcher.h"

namespace dscpp::nn::moe {

using GroupPtr = std::shared_ptr<comm::ProcessGroup>;

class ExpertParallelError : public dscpp::Error {
 public:
  using dscpp::Error::Error;
};

// What dispatch made and combine needs.
struct ExpertParallelDispatch {
  at::Tensor rows;                   // [sum(local_counts), H] local-expert-major
  at::Tensor local_counts;           // int64 [E_l] on the host: rows per local expert
  std::vector<int64_t> by_source;    // [ep * E_l]: rows from source rank i for local expert e
  std::vector<int64_t> send_splits;  // rows sent to each rank of the group
  std::vector<int64_t> recv_splits;  // rows received from each
  int64_t num_local_experts = 0;
};

ExpertParallelDispatch expert_parallel_dispatch(const at::Tensor& rows, const at::Tensor& counts,
                                                const GroupPtr& ep_group);

// expert_rows [sum(local_counts), H'] in dispatch's order -> [sum(counts), H'] on this rank
// (no padding rows: unpermute_tokens takes that).
at::Tensor expert_parallel_combine(const at::Tensor& expert_rows,
                                   const ExpertParallelDispatch& dispatched,
                                   const GroupPtr& ep_group);

// The differentiable variable-size all-to-all along dim 0 (comm::ProcessGroup::all_to_all with
// splits in forward; the reverse exchange of the gradient in backward).
at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits, const GroupPtr& group);

// tokens -> this rank's local experts' rows over ep_group (experts in contiguous blocks of
// num_experts / group size) -> back to [S, H'] in combine.
class AllToAllTokenDispatcher : public TokenDispatcher {
 public:
  explicit AllToAllTokenDispatcher(GroupPtr ep_group);
  ExpertInput dispatch(const at::Tensor& tokens, const Routing& routing) override;
  at::Tensor combine(const at::Tensor& expert_rows) override;

 private:
  GroupPtr ep_group_;
  PermutedTokens permuted_;
  ExpertParallelDispatch dispatched_;
};

}  // namespace dscpp::nn::moe
