// FlatLayout::build: pure arithmetic, no tensors.
#include "dscpp/zero/flat_layout.h"

#include <algorithm>
#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::zero {

FlatLayout FlatLayout::build(const std::vector<int64_t>& numels, int world_size,
                             int64_t bucket_size, int64_t alignment,
                             const std::vector<int>& group_of, const std::vector<int>& unit_of,
                             const std::vector<int>& ready_order) {
  if (world_size < 1 || bucket_size < 1 || alignment < 1)
    throw dscpp::Error("FlatLayout: world_size, bucket_size and alignment must be >= 1");
  if (!group_of.empty() && group_of.size() != numels.size())
    throw dscpp::Error("FlatLayout: a group for every parameter");
  if (!unit_of.empty() && unit_of.size() != numels.size())
    throw dscpp::Error("FlatLayout: a unit for every parameter");
  auto unit = [&](int i) { return unit_of.empty() ? 0 : unit_of[i]; };
  // Each parameter's place in the ready order (reverse registration order by default).
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
  for (int g = 0; g < num_groups; ++g) {
    const int64_t part_begin = l.partition;
    open.group = g;
    std::vector<int> order;
    for (int i = 0; i < static_cast<int>(numels.size()); ++i)
      if ((group_of.empty() ? 0 : group_of[i]) == g) order.push_back(i);
    // Highest unit first, -1 (persistent) last; within a unit, the order backward makes
    // the gradients ready.
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      if (unit(a) != unit(b)) return unit(a) > unit(b);
      return when[a] < when[b];
    });
    for (int i : order) {
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
