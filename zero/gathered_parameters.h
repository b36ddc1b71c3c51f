// GatheredParameters: DeepSpeed's deepspeed.zero.GatheredParameters. For the scope's life
// the named parameters hold their full values on every rank (at stage 3 only the buckets
// that hold them are all-gathered; at stages 0-2 they always do); at its end the buckets
// this scope gathered go back to rest. With modifier_rank >= 0, what that rank wrote into
// the named parameters in the scope becomes every rank's value, in the 16-bit parameters
// and in the fp32 master copy (stage 3: the partitions of every bucket gathered at the end,
// persistent ones included; stages 0-2: a broadcast of each named parameter). Parameters
// ZeRO does not hold (frozen ones) are always whole; a modifier's change to them is
// broadcast too.
//
// Collective: every rank opens the scope with the same parameters, in the same order, and
// closes it. The destructor never throws: a failure there (a peer gone during the
// modifier's broadcast) goes to the sink, through which the engine's next call throws it;
// without a sink it is printed and the process terminates, since the ranks no longer agree.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::zero {

// Receives a scope's failure on exit (its message).
using ExitErrorSink = std::function<void(const std::string& what)>;

class GatheredParameters {
 public:
  // params: tensors of the module whose ZeRO state `zero` holds. group: zero's group (the
  // modifier's broadcasts). modifier_rank: -1 (read only) or a rank of group.
  GatheredParameters(ZeroOptimizer& zero, comm::ProcessGroup& group, std::vector<at::Tensor> params,
                     int modifier_rank = -1, ExitErrorSink on_exit_error = {});
  // Every parameter ZeRO holds, read only (the whole model, e.g. to save or inspect it).
  explicit GatheredParameters(ZeroOptimizer& zero);
  ~GatheredParameters();
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

  // The buckets this scope all-gathered (at rest before it), ascending.
  const std::vector<int>& gathered_buckets() const { return gathered_; }

 private:
  void close();             // the modifier's values to every rank, then release
  void release() noexcept;  // the buckets this scope gathered, back to rest
  void spread_modified();   // stages 0-2 and non-ZeRO tensors: broadcast, master copy
  void report(const std::string& what) noexcept;

  ZeroOptimizer& zero_;
  comm::ProcessGroup* group_ = nullptr;  // null: read only
  std::vector<at::Tensor> params_;       // as named
  std::vector<int> zero_index_;          // per named tensor: its index in zero.params(), or -1
  std::vector<int> gathered_;
  int modifier_rank_ = -1;
  ExitErrorSink on_exit_error_;
};

}  // namespace dscpp::zero
