// relay_flat, relay_partition: see relayout.h.
#include "dscpp/zero/relayout.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::zero {

namespace {

// The whole flat buffer of layout l from every rank's partition (all[r]: rank r's).
at::Tensor flat_from_partitions(const FlatLayout& l, const at::Tensor& all) {
  at::Tensor flat = at::zeros({l.total}, all.options());
  for (const auto& b : l.buckets)
    for (int r = 0; r < l.world_size; ++r)
      flat.slice(0, b.begin + r * b.chunk, b.begin + (r + 1) * b.chunk)
          .copy_(all[r].slice(0, b.part_offset, b.part_offset + b.chunk));
  return flat;
}

at::Tensor partition_of(const FlatLayout& l, const at::Tensor& flat, int rank) {
  at::Tensor part = at::empty({l.partition}, flat.options());
  for (const auto& b : l.buckets)
    part.slice(0, b.part_offset, b.part_offset + b.chunk)
        .copy_(flat.slice(0, b.begin + rank * b.chunk, b.begin + (rank + 1) * b.chunk));
  return part;
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

at::Tensor relay_partition(const FlatLayout& from, const FlatLayout& to, const at::Tensor& part,
                           int rank, comm::ProcessGroup& group) {
  if (from.world_size != to.world_size)
    throw Error("relay_partition: layouts of different world sizes");
  if (from.world_size == 1) return relay_flat(from, to, part);
  at::Tensor all = at::empty({from.world_size * from.partition}, part.options());
  group.all_gather(all, part.contiguous()).wait();
  return partition_of(
      to, relay_flat(from, to, flat_from_partitions(from, all.view({from.world_size, -1}))), rank);
}

}  // namespace dscpp::zero
