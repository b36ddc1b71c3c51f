// Moving ZeRO's buffers from one FlatLayout to another of the same parameters (the re-lay
// after the first backward, zero_optimizer.h): a flat buffer is permuted parameter by
// parameter; a partition (this rank's chunks) is all-gathered into the old flat order first,
// since under the new layout this rank owns other elements. Padding comes out as zeros.
#pragma once

#include <ATen/core/Tensor.h>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/flat_layout.h"

namespace dscpp::zero {

// A flat buffer of layout `from` (from.total elements) laid out as `to`. No communication.
at::Tensor relay_flat(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat);

// Rank `rank`'s partition of `from` (from.partition elements) as its partition of `to`.
// Collective over `group` when the layouts have more than one partition (every rank calls
// it with its own partition); a local permutation otherwise.
at::Tensor relay_partition(const FlatLayout& from, const FlatLayout& to, const at::Tensor& part,
                           int rank, comm::ProcessGroup& group);

}  // namespace dscpp::zero
