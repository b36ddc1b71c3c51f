// DsLayout and the re-mapping between DeepSpeed's partitions and ours: see ds_partition.h.
#include "dscpp/runtime/checkpoint/ds_partition.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include "dscpp/runtime/checkpoint/ds_layout.h"

namespace dscpp::checkpoint {

DsLayout DsLayout::build(const std::vector<int64_t>& numels, int world_size,
                         const std::vector<int64_t>& paddings) {
  if (world_size < 1) throw CheckpointError("DsLayout: world_size must be >= 1");
  if (!paddings.empty() && paddings.size() != numels.size()) {
    throw CheckpointError("DsLayout: " + std::to_string(paddings.size()) + " paddings for " +
                          std::to_string(numels.size()) + " parameters");
  }
  DsLayout ds;
  ds.numels = numels;
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

DsLayout DsLayout::build_stage3(const std::vector<int64_t>& numels, int world_size) {
  if (world_size < 1) throw CheckpointError("DsLayout: world_size must be >= 1");
  DsLayout ds;
  ds.numels = numels;
  ds.world_size = world_size;
  ds.per_parameter = true;
  for (int64_t n : numels) {
    ds.offsets.push_back(ds.partition);  // where the parameter's slice sits in every file
    ds.partition += (n + world_size - 1) / world_size;
    ds.total += n;
  }
  return ds;
}

int64_t DsLayout::end(int r) const {
  if (per_parameter) return partition;
  return std::clamp<int64_t>(total, begin(r), begin(r) + partition);
}

std::vector<DsLayout::Segment> DsLayout::segments(int r) const {
  std::vector<Segment> out;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (per_parameter) {
      const int64_t c = (numels[i] + world_size - 1) / world_size;
      const int64_t first = std::min<int64_t>(r * c, numels[i]);
      const int64_t last = std::min<int64_t>((r + 1) * c, numels[i]);
      if (first < last) out.push_back({static_cast<int>(i), first, last - first, offsets[i]});
    } else {
      const int64_t lo = begin(r), hi = end(r);
      const int64_t x0 = std::max(lo, offsets[i]), x1 = std::min(hi, offsets[i] + numels[i]);
      if (x0 < x1) out.push_back({static_cast<int>(i), x0 - offsets[i], x1 - x0, x0 - lo});
    }
  }
  return out;
}

namespace {

// Bucket b whole, every rank's chunk, as our flat buffer holds it in [b.begin, b.end), from each
// rank's partition. Collective over `group`.
at::Tensor whole_bucket(const zero::FlatLayout& ours, const zero::FlatLayout::Bucket& b,
                        const at::Tensor& partition, comm::ProcessGroup& group) {
  at::Tensor mine = partition.slice(0, b.part_offset, b.part_offset + b.chunk);
  if (ours.world_size == 1) return mine;
  at::Tensor bucket = at::empty({b.chunk * ours.world_size}, partition.options());
  group.all_gather(bucket, mine.contiguous()).wait();
  return bucket;
}

}  // namespace

at::Tensor to_ds_partition(const zero::FlatLayout& ours, const DsLayout& ds,
                           const at::Tensor& partition, comm::ProcessGroup& group) {
  const int r = group.rank();
  if (ds.world_size != group.size()) {
    throw CheckpointError("to_ds_partition: DeepSpeed layout for " + std::to_string(ds.world_size) +
                          " ranks in a group of " + std::to_string(group.size()));
  }
  at::Tensor out = at::zeros({ds.held(r)}, partition.options().dtype(at::kFloat));
  const auto segments = ds.segments(r);
  for (size_t bi = 0; bi < ours.buckets.size(); ++bi) {
    const auto& b = ours.buckets[bi];
    const at::Tensor bucket = whole_bucket(ours, b, partition, group);
    for (const auto& s : segments) {
      const auto& p = ours.params[s.param];
      if (p.bucket != static_cast<int>(bi)) continue;
      const int64_t src = p.offset - b.begin + s.first;
      out.slice(0, s.at, s.at + s.count).copy_(bucket.slice(0, src, src + s.count));
    }
  }
  return out.cpu();
}

void from_ds_partition(const zero::FlatLayout& ours, int rank, const DsLayout& ds, int file_rank,
                       const at::Tensor& saved, at::Tensor& partition) {
  if (saved.numel() > ds.partition) {
    throw CheckpointError("partition " + std::to_string(file_rank) + " holds " +
                          std::to_string(saved.numel()) + " elements, more than its " +
                          std::to_string(ds.partition));
  }
  at::Tensor src_all = saved.detach().to(partition.device(), at::kFloat);
  for (const auto& s : ds.segments(file_rank)) {
    if (s.at + s.count > saved.numel())
      throw CheckpointError("partition " + std::to_string(file_rank) + " is shorter (" +
                            std::to_string(saved.numel()) + " elements) than its layout");
    const auto& p = ours.params[s.param];
    const auto& b = ours.buckets[p.bucket];
    const int64_t own = b.begin + rank * b.chunk;  // our chunk of this bucket: [own, own+chunk)
    // Parameter elements we own here, and of those the ones this segment holds.
    const int64_t a = std::max<int64_t>(own - p.offset, 0);
    const int64_t e = std::min<int64_t>(own + b.chunk - p.offset, p.numel);
    const int64_t x0 = std::max(a, s.first), x1 = std::min(e, s.first + s.count);
    if (x0 >= x1) continue;
    const int64_t dst = b.part_offset + p.offset + x0 - own;
    partition.slice(0, dst, dst + (x1 - x0))
        .copy_(src_all.slice(0, s.at + (x0 - s.first), s.at + (x1 - s.first)));
  }
}

std::vector<int> ds_whole_params(const DsLayout& ds, int r) {
  std::vector<int> out;
  for (const auto& s : ds.segments(r))
    if (out.empty() || out.back() != s.param) out.push_back(s.param);
  return out;
}

at::Tensor to_ds_whole_params(const zero::FlatLayout& ours, const DsLayout& ds,
                              const at::Tensor& partition, comm::ProcessGroup& group) {
  const std::vector<int> params = ds_whole_params(ds, group.rank());
  std::vector<int64_t> at_of(ours.params.size(), -1);
  int64_t total = 0;
  for (int p : params) {
    at_of[p] = total;
    total += ours.params[p].numel;
  }
  at::Tensor out = at::zeros({total}, partition.options().dtype(at::kFloat));
  for (size_t bi = 0; bi < ours.buckets.size(); ++bi) {
    const auto& b = ours.buckets[bi];
    // Every rank gathers every bucket (the collective is the same on all of them).
    const at::Tensor bucket = whole_bucket(ours, b, partition, group);
    for (int i : b.params) {
      if (at_of[i] < 0) continue;
      const auto& p = ours.params[i];
      out.slice(0, at_of[i], at_of[i] + p.numel)
          .copy_(bucket.slice(0, p.offset - b.begin, p.offset - b.begin + p.numel));
    }
  }
  return out.cpu();
}

void from_ds_whole_params(const zero::FlatLayout& ours, int rank, const DsLayout& ds, int file_rank,
                          const at::Tensor& saved, at::Tensor& partition) {
  at::Tensor src_all = saved.detach().reshape({-1}).to(partition.device(), at::kFloat);
  int64_t at = 0;
  for (int i : ds_whole_params(ds, file_rank)) {
    const auto& p = ours.params[i];
    if (at + p.numel > src_all.numel())
      throw CheckpointError(
          "partition " + std::to_string(file_rank) + " holds " + std::to_string(src_all.numel()) +
          " elements, fewer than its parameters' whole " + std::to_string(at + p.numel));
    const auto& b = ours.buckets[p.bucket];
    const int64_t own = b.begin + rank * b.chunk;
    const int64_t x0 = std::max<int64_t>(own - p.offset, 0);
    const int64_t x1 = std::min<int64_t>(own + b.chunk - p.offset, p.numel);
    if (x0 < x1) {
      const int64_t dst = b.part_offset + p.offset + x0 - own;
      partition.slice(0, dst, dst + (x1 - x0)).copy_(src_all.slice(0, at + x0, at + x1));
    }
    at += p.numel;
  }
}

}  // namespace dscpp::checkpoint
