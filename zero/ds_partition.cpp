// DsLayout and the re-mapping between DeepSpeed's partitions and ours: see ds_partition.h.
#include "zero/ds_partition.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dscpp::zero {

DsLayout DsLayout::build(const std::vector<int64_t>& numels, int world_size,
                         const std::vector<int64_t>& paddings) {
  if (world_size < 1) throw std::invalid_argument("DsLayout: world_size must be >= 1");
  if (!paddings.empty() && paddings.size() != numels.size()) {
    throw std::invalid_argument("DsLayout: " + std::to_string(paddings.size()) + " paddings for " +
                                std::to_string(numels.size()) + " parameters");
  }
  DsLayout ds;
  ds.world_size = world_size;
  int64_t at = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    ds.offsets.push_back(at);
    at += numels[i] + (paddings.empty() ? 0 : paddings[i]);
  }
  ds.total = at;
  // DeepSpeed aligns the group to 2 elements per rank (4 bytes of fp16) before splitting.
  const int64_t align = 2 * static_cast<int64_t>(world_size);
  ds.partition = (at + align - 1) / align * align / world_size;
  return ds;
}

int64_t DsLayout::end(int r) const {
  return std::clamp<int64_t>(total, begin(r), begin(r) + partition);
}

namespace {

// Calls f(param, first, last) for every parameter's elements [first, last) (parameter
// coordinates) that lie inside our bucket range [lo, hi) of the flat buffer.
template <typename F>
void for_params_in(const FlatLayout& ours, const FlatLayout::Bucket& b, int64_t lo, int64_t hi,
                   F&& f) {
  for (int i : b.params) {
    const auto& p = ours.params[i];
    int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (a < e) f(i, a - p.offset, e - p.offset);
  }
}

}  // namespace

at::Tensor to_ds_partition(const FlatLayout& ours, const DsLayout& ds, const at::Tensor& partition,
                           comm::ProcessGroup& group) {
  const int r = group.rank();
  if (ds.world_size != group.size()) {
    throw std::invalid_argument("to_ds_partition: DeepSpeed layout for " +
                                std::to_string(ds.world_size) + " ranks in a group of " +
                                std::to_string(group.size()));
  }
  const int64_t lo = ds.begin(r), hi = ds.end(r);
  at::Tensor out = at::zeros({hi - lo}, partition.options().dtype(at::kFloat));
  for (const auto& b : ours.buckets) {
    // The whole bucket, every rank's chunk, as our flat buffer holds it in [b.begin, b.end).
    at::Tensor bucket;
    at::Tensor mine = partition.slice(0, b.part_offset, b.part_offset + b.chunk);
    if (ours.world_size == 1) {
      bucket = mine;
    } else {
      bucket = at::empty({b.chunk * ours.world_size}, partition.options());
      group.all_gather(bucket, mine.contiguous()).wait();
    }
    for_params_in(ours, b, b.begin, b.end, [&](int i, int64_t a, int64_t e) {
      // The parameter's elements [a, e) sit at ds.offsets[i] + a.. in DeepSpeed's buffer.
      int64_t x0 = std::max(lo, ds.offsets[i] + a), x1 = std::min(hi, ds.offsets[i] + e);
      if (x0 >= x1) return;
      int64_t src = ours.params[i].offset + (x0 - ds.offsets[i]) - b.begin;
      out.slice(0, x0 - lo, x1 - lo).copy_(bucket.slice(0, src, src + (x1 - x0)));
    });
  }
  return out.cpu();
}

void from_ds_partition(const FlatLayout& ours, int rank, const DsLayout& ds, int file_rank,
                       const at::Tensor& saved, at::Tensor& partition) {
  const int64_t lo = ds.begin(file_rank), hi = lo + saved.numel();
  if (hi > ds.begin(file_rank) + ds.partition) {
    throw std::runtime_error("partition " + std::to_string(file_rank) + " holds " +
                             std::to_string(saved.numel()) + " elements, more than its " +
                             std::to_string(ds.partition));
  }
  at::Tensor src_all = saved.to(partition.device(), at::kFloat);
  for (const auto& b : ours.buckets) {
    const int64_t own = b.begin + rank * b.chunk;  // our chunk of this bucket: [own, own+chunk)
    for_params_in(ours, b, own, own + b.chunk, [&](int i, int64_t a, int64_t e) {
      int64_t x0 = std::max(lo, ds.offsets[i] + a), x1 = std::min(hi, ds.offsets[i] + e);
      if (x0 >= x1) return;
      int64_t dst = b.part_offset + ours.params[i].offset + (x0 - ds.offsets[i]) - own;
      partition.slice(0, dst, dst + (x1 - x0)).copy_(src_all.slice(0, x0 - lo, x1 - lo));
    });
  }
}

}  // namespace dscpp::zero
