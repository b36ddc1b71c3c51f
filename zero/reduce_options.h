// How ZeRO reduces its gradient buckets: the options of grad_buckets.h, which the partition
// sinks (partition_sink.h) read too.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

namespace dscpp::zero {

struct ReduceOptions {
  bool scatter = false;  // keep only this rank's chunk (stages 1, 2) instead of the whole bucket
  // With scatter: one reduce-scatter per bucket (DeepSpeed's reduce_scatter: true), or an
  // all-reduce of which each rank keeps its chunk (false: more traffic, DeepSpeed's choice
  // for reductions the scatter cannot do).
  bool use_reduce_scatter = true;
  bool overlap_comm = false;  // keep collectives in flight (two at a time) while backward runs
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<at::ScalarType> communication_data_type;  // unset: the gradients' type
  // How many ranks' gradients the reduced sum is averaged over; 0: the group's size. Experts'
  // gradients are summed over the expert-data group and averaged over the whole data group
  // (DeepSpeed's _reduce_expert_gradients and its ZeRO 1-2: "to maintain the gradients value
  // unaffected by ep_size"), since each expert's gradient already sums its expert-parallel
  // group's tokens.
  int average_over = 0;
};

}  // namespace dscpp::zero
