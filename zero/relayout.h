// Moving ZeRO's buffers from one FlatLayout to another of the same parameters (the re-lay
// after the first backward, zero_optimizer.h): a flat buffer is permuted parameter by
// parameter; a partition (this rank's chunks) is all-gathered into the old flat order first,
// since under the new layout this rank owns other elements. Padding comes out as zeros.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/flat_layout.h"

namespace dscpp::zero {

// A flat buffer of layout `from` (from.total elements) laid out as `to`. No communication.
at::Tensor relay_flat(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat);

// Rank `rank`'s partition of `from` (from.partition elements) as its partition of `to`, on
// part's device. Collective over `group` when the layouts have more than one partition (every
// rank calls it with its own partition): one old bucket at a time is all-gathered on
// `collective_device` (where the group's collectives run), so that device holds at most one
// bucket beyond its own buffers whatever part's size and place (an offloaded fp32 master of
// billions of elements goes through it a bucket at a time). A local permutation otherwise.
at::Tensor relay_partition(const FlatLayout& from, const FlatLayout& to, const at::Tensor& part,
                           int rank, comm::ProcessGroup& group, c10::Device collective_device);

// Buffer t (a flat buffer of `from` when !partition, else this rank's partition) re-laid:
// a host buffer becomes a new tensor; one on an accelerator is permuted in its own storage
// (relay_flat_in_place) where it is a flat buffer of an unchanged size, else re-laid in host
// memory and copied back (a 16-bit model, or its gradient partition, sized to fit: the device
// never holds a second copy), in place where the size stays, else replaced by a new tensor there.
void relay_in_place(const FlatLayout& from, const FlatLayout& to, at::Tensor& t, bool partition,
                    int rank, comm::ProcessGroup& group, c10::Device collective_device);

// The order a flat buffer is permuted in its own storage (relay_flat_in_place): the parameters
// that move, by their new offset, and before placing order[k] the ones whose old place it
// overwrites (still unplaced) set aside; peak: the elements aside at once. A parameter that keeps
// its offset is never touched. When the new order is the old one with a few parameters moved
// (the first backward's order against the registration order's guess) only those are aside.
struct InPlacePlan {
  std::vector<int> order;
  std::vector<std::vector<int>> aside;  // one list per entry of order
  int64_t peak = 0;
};
InPlacePlan plan_in_place(const FlatLayout& from, const FlatLayout& to);

// Whether relay_flat_in_place can re-lay t: a flat buffer (or a partition of one rank, which is
// its flat buffer) of the layouts' unchanged size.
bool relays_in_place(const FlatLayout& from, const FlatLayout& to, const at::Tensor& t,
                     bool partition);

// Flat buffer t (from.total == to.total elements, on any device) laid out as `to` in its own
// storage, as relay_flat would lay it into a new tensor (padding zero): the extra memory is
// the plan's peak, beside t where it fits, else on the host; no communication. A one-rank
// partition is its flat buffer.
void relay_flat_in_place(const FlatLayout& from, const FlatLayout& to, const at::Tensor& t);

}  // namespace dscpp::zero
