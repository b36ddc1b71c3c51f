// The expert-parallel exchange between the permuted tokens and the local experts. The
// experts lie on the expert-parallel group in contiguous blocks: group rank r owns experts
// [r*E_l, (r+1)*E_l), E_l = num_experts / ep_size. Two layouts:
// - Variable (dropless; the dispatchers' hand-over format): this rank's routed rows sorted
//   expert-major for the GLOBAL experts, [N, H] with N >= sum(counts) (rows past sum(counts)
//   are padding, not sent), counts int64 [num_experts]. dispatch first exchanges the counts
//   (an all-to-all of the [ep, E_l] counts) and reads them on the host (the splits: on a GPU a
//   synchronisation, which dropless routing needs), then the rows (a variable-size
//   all-to-all), and regroups what arrived local-expert-major (within an expert, by source
//   rank), ready for one grouped GEMM.
// - Padded (a capacity C; permute_tokens_padded): [E * C, H], C slots per global expert. One
//   fixed-size all-to-all of the [ep, E_l, C, H] blocks (DeepSpeed's _AllToAll of its
//   dispatched [E, C, H]), regrouped to [E_l, ep * C, H] for run_padded_experts: no count is
//   read on the host. Every rank of the group must dispatch the same C (DeepSpeed's rule: the
//   same tokens per forward); a group that does not is a failed exchange (CommError).
// combine is the exact reverse, back to this rank's rows in their dispatched order and layout.
// Both are differentiable: each all-to-all's backward is the reverse all-to-all, the
// regrouping a split and a concatenation (a transpose when padded). Each rows exchange runs as
// an AllToAllInFlight (all_to_all_in_flight.h): `beside` runs while it is on the wire, and its
// backward while the gradient's exchange is. ep_group null or of size one: no communication
// (identity; beside runs at once).
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
  // Variable: [sum(local_counts), H] local-expert-major. Padded: [E_l, ep * C, H].
  at::Tensor rows;
  at::Tensor local_counts;           // int64 [E_l] on the host: rows per local expert (variable)
  std::vector<int64_t> by_source;    // [ep * E_l]: rows from source rank i for local expert e
  std::vector<int64_t> send_splits;  // rows sent to each rank of the group
  std::vector<int64_t> recv_splits;  // rows received from each
  int64_t num_local_experts = 0;
  int64_t capacity = -1;  // the padded layout's C; -1: the variable one
};

ExpertParallelDispatch expert_parallel_dispatch(const at::Tensor& rows, const at::Tensor& counts,
                                                const GroupPtr& ep_group,
                                                const Beside& beside = {});
// rows [num_experts * capacity, H] in the padded layout.
ExpertParallelDispatch expert_parallel_dispatch_padded(const at::Tensor& rows, int64_t num_experts,
                                                       int64_t capacity, const GroupPtr& ep_group,
                                                       const Beside& beside = {});

// expert_rows in dispatch's layout ([sum(local_counts), H'], or [E_l, ep * C, H']) -> this
// rank's rows: [sum(counts), H'] (no padding rows: unpermute_tokens takes that), or
// [E * C, H'] in the padded layout.
at::Tensor expert_parallel_combine(const at::Tensor& expert_rows,
                                   const ExpertParallelDispatch& dispatched,
                                   const GroupPtr& ep_group, const Beside& beside = {});

// tokens -> this rank's local experts' rows over ep_group (experts in contiguous blocks of
// num_experts / group size) -> back to [S, H'] in combine. A routing with a capacity goes in
// the padded layout (padded_capacity false: the variable one, the tests' comparison).
class AllToAllTokenDispatcher : public TokenDispatcher {
 public:
  explicit AllToAllTokenDispatcher(GroupPtr ep_group, bool padded_capacity = true);
  ExpertInput dispatch(const at::Tensor& tokens, const Routing& routing,
                       const Beside& beside = {}) override;
  at::Tensor combine(const at::Tensor& expert_rows, const Beside& beside = {}) override;

 private:
  GroupPtr ep_group_;
  bool padded_capacity_;
  PermutedTokens permuted_;
  ExpertParallelDispatch dispatched_;
};

}  // namespace dscpp::nn::moe
