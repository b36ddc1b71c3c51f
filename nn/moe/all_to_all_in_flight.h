// An all-to-all along dim 0 that is on the wire while the caller computes, in forward and
// again in backward: a pair of autograd nodes around work that does not depend on it.
//
// start() issues the exchange (comm::ProcessGroup::all_to_all: on NCCL on its communication
// stream, on Gloo in Gloo's own threads) and returns at once; what the caller computes before
// wait() runs beside it; wait() returns the received rows, differentiable. Backward mirrors
// it: the autograd engine runs ready nodes by decreasing creation order (its ready queue
// orders by sequence number), so the nodes made between start() and wait() in forward run
// between wait's and start's backward, after the nodes made later. wait's backward issues the
// reverse exchange of the gradient (the splits swapped) and returns; those nodes' backward
// runs while it is on the wire; start's backward waits for it and returns it as x's gradient.
// Values are those of a blocking exchange: only when the waits happen moves.
//
// Splits empty: equal chunks (the fixed-size exchange, x.size(0) divisible by the group's
// size); otherwise the variable-size exchange with those splits (ProcessGroup::all_to_all's
// rules). A group of one rank: no communication, wait() returns x. Every rank of the group
// must start and wait in the same order; wait() once per start().
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "dscpp/comm/process_group.h"

namespace dscpp::nn::moe {

class AllToAllInFlight {
 public:
  struct State;  // the issued exchanges, shared by the two nodes

  AllToAllInFlight();
  ~AllToAllInFlight();
  AllToAllInFlight(AllToAllInFlight&&) noexcept;
  AllToAllInFlight& operator=(AllToAllInFlight&&) noexcept;

  static AllToAllInFlight start(const at::Tensor& x,
                                const std::shared_ptr<comm::ProcessGroup>& group,
                                const std::vector<int64_t>& output_splits = {},
                                const std::vector<int64_t>& input_splits = {});
  // The received rows: [sum(output_splits) or x.size(0), ...] in x's dtype. Throws CommError
  // as Work::wait does, and dscpp::Error when called without a pending start.
  at::Tensor wait();

 private:
  c10::intrusive_ptr<State> state_;
  at::Tensor landing_;  // start's output: being written until wait(), for wait() only
  at::Tensor passed_;   // a group of one rank: x itself
};

}  // namespace dscpp::nn::moe
