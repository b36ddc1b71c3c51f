// FlatLayout::build: pure arithmetic, no tensors.
#include "zero/flat_layout.h"

#include <stdexcept>

namespace dscpp::zero {

FlatLayout FlatLayout::build(const std::vector<int64_t>& numels, int world_size,
                             int64_t bucket_size, int64_t alignment) {
  if (world_size < 1 || bucket_size < 1 || alignment < 1)
    throw std::invalid_argument("FlatLayout: world_size, bucket_size and alignment must be >= 1");
  FlatLayout l;
  l.world_size = world_size;
  l.params.resize(numels.size());
  const int64_t quantum = world_size * alignment;
  int64_t offset = 0;
  FlatLayout::Bucket open{0, 0, 0, 0, {}};
  auto close = [&]() {
    int64_t used = offset - open.begin;
    int64_t padded = (used + quantum - 1) / quantum * quantum;
    open.end = open.begin + padded;
    open.chunk = padded / world_size;
    open.part_offset = l.partition;
    l.partition += open.chunk;
    offset = open.end;
    l.buckets.push_back(open);
    open = FlatLayout::Bucket{offset, offset, 0, 0, {}};
  };
  for (int i = static_cast<int>(numels.size()) - 1; i >= 0; --i) {
    l.params[i] = {offset, numels[i], static_cast<int>(l.buckets.size())};
    open.params.push_back(i);
    offset += numels[i];
    if (offset - open.begin >= bucket_size) close();
  }
  if (!open.params.empty()) close();
  l.total = offset;
  return l;
}

}  // namespace dscpp::zero
