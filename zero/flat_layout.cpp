// FlatLayout::build and build_whole: pure arithmetic, no tensors.
#include "dscpp/zero/flat_layout.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::zero {

namespace {

// The parameters of each group in layout order: highest unit first, -1 (persistent) last;
// within a unit, the order backward makes the gradients ready (reverse registration order
// before one is known). Checks the arguments build and build_whole share.
std::vector<std::vector<int>> layout_order(const std::vector<int64_t>& numels, int world_size,
                                           int64_t bucket_size, int64_t alignment,
                                           const std::vector<int>& group_of,
                                           const std::vector<int>& unit_of,
                                           const std::vector<int>& ready_order) {
  if (world_size < 1 || bucket_size < 1 || alignment < 1)
    throw dscpp::Error("FlatLayout: world_size, bucket_size and alignment must be >= 1");
  if (!group_of.empty() && group_of.size() != numels.size())
    throw dscpp::Error("FlatLayout: a group for every parameter");
  if (!unit_of.empty() && unit_of.size() != numels.size())
    throw dscpp::Error("FlatLayout: a unit for every parameter");
  auto unit = [&](int i) { return unit_of.empty() ? 0 : unit_of[i]; };
  const int n = static_cast<int>(numels.size());
  std::vector<int> when(n);
  for (int i = 0; i < n; ++i) when[i] = n - 1 - i;
  if (!ready_order.empty()) {
    if (static_cast<int>(ready_order.size()) != n)
      throw Error("FlatLayout: a ready order must name every parameter once");
    std::vector<char> seen(n, 0);
    for (int k = 0; k < n; ++k) {
      const int i = ready_order[k];
      if (i < 0 || i >= n || seen[i])
        throw Error("FlatLayout: a ready order must name every parameter once");
      seen[i] = 1;
      when[i] = k;
    }
  }
  int num_groups = 1;
  for (int g : group_of) {
    if (g < 0) throw dscpp::Error("FlatLayout: negative group");
    num_groups = std::max(num_groups, g + 1);
  }
  std::vector<std::vector<int>> order(num_groups);
  for (int i = 0; i < n; ++i) order[group_of.empty() ? 0 : group_of[i]].push_back(i);
  for (auto& o : order)
    std::sort(o.begin(), o.end(), [&](int a, int b) {
      if (unit(a) != unit(b)) return unit(a) > unit(b);
      return when[a] < when[b];
    });
  return order;
}

}  // namespace

FlatLayout FlatLayout::build(const std::vector<int64_t>& numels, int world_size,
                             int64_t bucket_size, int64_t alignment,
                             const std::vector<int>& group_of, const std::vector<int>& unit_of,
                             const std::vector<int>& ready_order) {
  const auto order =
      layout_order(numels, world_size, bucket_size, alignment, group_of, unit_of, ready_order);
  auto unit = [&](int i) { return unit_of.empty() ? 0 : unit_of[i]; };
  FlatLayout l;
  l.world_size = world_size;
  l.params.resize(numels.size());
  const int64_t quantum = world_size * alignment;
  int64_t offset = 0;
  FlatLayout::Bucket open{0, 0, 0, 0, {}, 0, 0};
  auto close = [&]() {
    int64_t used = offset - open.begin;
    int64_t padded = (used + quantum - 1) / quantum * quantum;
    open.end = open.begin + padded;
    open.chunk = padded / world_size;
    open.part_offset = l.partition;
    l.partition += open.chunk;
    offset = open.end;
    const int group = open.group;
    l.buckets.push_back(open);
    open = FlatLayout::Bucket{offset, offset, 0, 0, {}, group, 0};
  };
  for (int g = 0; g < static_cast<int>(order.size()); ++g) {
    const int64_t part_begin = l.partition;
    open.group = g;
    for (int i : order[g]) {
      if (!open.params.empty() && open.unit != unit(i)) close();
      open.unit = unit(i);
      l.params[i] = {offset, numels[i], static_cast<int>(l.buckets.size())};
      open.params.push_back(i);
      offset += numels[i];
      if (offset - open.begin >= bucket_size) close();
    }
    if (!open.params.empty()) close();
    l.groups.push_back({part_begin, l.partition});
  }
  l.total = offset;
  return l;
}

FlatLayout FlatLayout::build_whole(const std::vector<int64_t>& numels, int world_size,
                                   int64_t bucket_size, int64_t alignment,
                                   const std::vector<double>& cost,
                                   const std::vector<int>& group_of,
                                   const std::vector<int>& unit_of,
                                   const std::vector<int>& ready_order) {
  const auto order =
      layout_order(numels, world_size, bucket_size, alignment, group_of, unit_of, ready_order);
  if (cost.size() != numels.size()) throw dscpp::Error("FlatLayout: a cost for every parameter");
  auto unit = [&](int i) { return unit_of.empty() ? 0 : unit_of[i]; };
  const int n = static_cast<int>(numels.size());
  // Owners: the costliest first, each to the least loaded rank (the longest-processing-time
  // rule: at most 4/3 of the best balance).
  std::vector<int> by_cost(n);
  std::iota(by_cost.begin(), by_cost.end(), 0);
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](int a, int b) { return cost[a] > cost[b]; });
  std::vector<int> owner(n, 0);
  std::vector<double> load(world_size, 0.0);
  for (int i : by_cost) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[r] += cost[i];
  }
  FlatLayout l;
  l.world_size = world_size;
  l.params.resize(n);
  const int64_t share = std::max<int64_t>(1, bucket_size / world_size);
  int64_t offset = 0;
  for (int g = 0; g < static_cast<int>(order.size()); ++g) {
    const int64_t part_begin = l.partition;
    // One unit at a time (no bucket holds two), each rank's parameters queued in order.
    for (size_t s = 0; s < order[g].size();) {
      size_t e = s;
      while (e < order[g].size() && unit(order[g][e]) == unit(order[g][s])) ++e;
      std::vector<std::vector<int>> queue(world_size);
      for (size_t k = s; k < e; ++k) queue[owner[order[g][k]]].push_back(order[g][k]);
      std::vector<size_t> next(world_size, 0);
      for (;;) {
        std::vector<std::vector<int>> taken(world_size);
        int64_t widest = 0;
        for (int r = 0; r < world_size; ++r) {
          int64_t used = 0;
          while (next[r] < queue[r].size() && (taken[r].empty() || used < share)) {
            const int i = queue[r][next[r]++];
            taken[r].push_back(i);
            used += numels[i];
          }
          widest = std::max(widest, used);
        }
        if (widest == 0 && std::all_of(taken.begin(), taken.end(),
                                       [](const std::vector<int>& t) { return t.empty(); }))
          break;
        Bucket b{offset, 0, 0, l.partition, {}, g, unit(order[g][s])};
        b.chunk = std::max<int64_t>(alignment, (widest + alignment - 1) / alignment * alignment);
        b.end = b.begin + b.chunk * world_size;
        for (int r = 0; r < world_size; ++r) {
          int64_t at = b.begin + r * b.chunk;
          for (int i : taken[r]) {
            l.params[i] = {at, numels[i], static_cast<int>(l.buckets.size())};
            b.params.push_back(i);
            at += numels[i];
          }
        }
        l.partition += b.chunk;
        offset = b.end;
        l.buckets.push_back(std::move(b));
      }
      s = e;
    }
    l.groups.push_back({part_begin, l.partition});
  }
  l.total = offset;
  return l;
}

int FlatLayout::owner_of(int i) const {
  const Param& p = params.at(i);
  const Bucket& b = buckets.at(p.bucket);
  return static_cast<int>((p.offset - b.begin) / b.chunk);
}

bool FlatLayout::same_placement(const FlatLayout& o) const {
  if (total != o.total || partition != o.partition || params.size() != o.params.size() ||
      buckets.size() != o.buckets.size())
    return false;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].offset != o.params[i].offset || params[i].bucket != o.params[i].bucket)
      return false;
  for (size_t b = 0; b < buckets.size(); ++b)
    if (buckets[b].begin != o.buckets[b].begin || buckets[b].end != o.buckets[b].end) return false;
  return true;
}

}  // namespace dscpp::zero
