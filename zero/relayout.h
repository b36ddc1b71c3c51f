// Moving a flat buffer from one FlatLayout to another of the same parameters: ZeRO's 16-bit
// flat buffer when the first backward has shown backward's order (zero_optimizer.h), before
// anything else is laid out. Padding comes out as zeros.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dscpp/zero/flat_layout.h"

namespace dscpp::zero {

// A flat buffer of layout `from` (from.total elements) laid out as `to`, in a new tensor.
at::Tensor relay_flat(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat);

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

// Flat buffer t (from.total == to.total elements, on any device) laid out as `to` in its own
// storage, as relay_flat would lay it into a new tensor (padding zero): the extra memory is
// the plan's peak, beside t where it fits, else on the host.
void relay_flat_in_place(const FlatLayout& from, const FlatLayout& to, const at::Tensor& t);

}  // namespace dscpp::zero
