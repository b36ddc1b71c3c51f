// relay_flat, plan_in_place, relay_flat_in_place: see relayout.h.
#include "dscpp/zero/relayout.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/error.h"

namespace dscpp::zero {
namespace {

// An empty tensor, or nothing where the device has no room for it (the caching allocator has
// already freed its cache and retried).
std::optional<at::Tensor> empty_if_room(int64_t numel, const at::TensorOptions& options) {
  try {
    return at::empty({numel}, options);
  } catch (const c10::OutOfMemoryError&) {
    return std::nullopt;
  }
}

}  // namespace

at::Tensor relay_flat(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat) {
  if (from.params.size() != to.params.size() || flat.numel() != from.total)
    throw Error("relay_flat: layouts of different parameters, or a buffer of " +
                std::to_string(flat.numel()) + " elements for a layout of " +
                std::to_string(from.total));
  at::Tensor out = at::zeros({to.total}, flat.options());
  for (size_t i = 0; i < to.params.size(); ++i) {
    const auto& a = from.params[i];
    const auto& b = to.params[i];
    out.slice(0, b.offset, b.offset + b.numel).copy_(flat.slice(0, a.offset, a.offset + a.numel));
  }
  return out;
}

InPlacePlan plan_in_place(const FlatLayout& from, const FlatLayout& to) {
  const int n = static_cast<int>(from.params.size());
  if (static_cast<int>(to.params.size()) != n || from.total != to.total)
    throw Error("relay_flat_in_place: layouts of different parameters or sizes");
  std::vector<int> by_old(n);
  for (int i = 0; i < n; ++i) by_old[i] = i;
  std::sort(by_old.begin(), by_old.end(),
            [&](int a, int b) { return from.params[a].offset < from.params[b].offset; });
  std::vector<int64_t> old_begin(n);
  for (int k = 0; k < n; ++k) old_begin[k] = from.params[by_old[k]].offset;
  auto moves = [&](int i) {
    return from.params[i].numel > 0 && from.params[i].offset != to.params[i].offset;
  };
  InPlacePlan plan;
  for (int i = 0; i < n; ++i)
    if (moves(i)) plan.order.push_back(i);
  std::sort(plan.order.begin(), plan.order.end(),
            [&](int a, int b) { return to.params[a].offset < to.params[b].offset; });
  std::vector<char> placed(n, 0), aside(n, 0);
  int64_t held = 0;
  for (int i : plan.order) {
    const int64_t lo = to.params[i].offset, hi = lo + to.params[i].numel;
    // Old ranges are disjoint and sorted: those that reach into [lo, hi) end the list of the
    // ones beginning before hi.
    std::vector<int> now;
    for (int k = static_cast<int>(std::upper_bound(old_begin.begin(), old_begin.end(), hi - 1) -
                                  old_begin.begin()) -
                 1;
         k >= 0; --k) {
      const auto& p = from.params[by_old[k]];
      if (p.numel == 0) continue;  // (it may share its offset with the next: no order among them)
      if (p.offset + p.numel <= lo) break;
      const int j = by_old[k];
      if (!moves(j) || placed[j] || aside[j]) continue;
      aside[j] = 1;
      held += p.numel;
      now.push_back(j);
    }
    plan.peak = std::max(plan.peak, held);
    plan.aside.push_back(std::move(now));
    placed[i] = 1;
    if (aside[i]) held -= to.params[i].numel;
  }
  return plan;
}

void relay_flat_in_place(const FlatLayout& from, const FlatLayout& to, const at::Tensor& t) {
  if (t.dim() != 1 || t.numel() != from.total)
    throw Error("relay_flat_in_place: a buffer of " + std::to_string(t.numel()) +
                " elements for a layout of " + std::to_string(from.total));
  const InPlacePlan plan = plan_in_place(from, to);
  // Where the parameters set aside wait: beside the buffer where they fit there (nothing but
  // what the plan says is ever held), else on the host.
  c10::Device aside_device = t.device();
  if (!t.is_cpu() && !empty_if_room(plan.peak, t.options())) aside_device = c10::Device(c10::kCPU);
  std::map<int, at::Tensor> held;
  for (size_t k = 0; k < plan.order.size(); ++k) {
    for (int j : plan.aside[k]) {
      const auto& a = from.params[j];
      held[j] = t.slice(0, a.offset, a.offset + a.numel)
                    .to(aside_device, /*non_blocking=*/false,
                        /*copy=*/true);
    }
    const int i = plan.order[k];
    const auto& a = from.params[i];
    const auto& b = to.params[i];
    auto it = held.find(i);
    const at::Tensor source =
        it != held.end() ? it->second : t.slice(0, a.offset, a.offset + a.numel);
    t.slice(0, b.offset, b.offset + b.numel).copy_(source);
    if (it != held.end()) held.erase(it);
  }
  // The new layout's padding: zeros (whatever parameter left its values there).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& p : to.params) ranges.emplace_back(p.offset, p.offset + p.numel);
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > at) t.slice(0, at, lo).zero_();
    at = std::max(at, hi);
  }
  if (at < to.total) t.slice(0, at, to.total).zero_();
}

}  // namespace dscpp::zero
