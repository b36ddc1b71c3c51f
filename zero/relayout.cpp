// relay_flat, relay_partition: see relayout.h.
#include "dscpp/zero/relayout.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::zero {

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
                           int rank, comm::ProcessGroup& group, c10::Device collective_device) {
  if (from.world_size != to.world_size)
    throw Error("relay_partition: layouts of different world sizes");
  if (from.world_size == 1) return relay_flat(from, to, part);
  const int world = from.world_size;
  at::Tensor out = at::zeros({to.partition}, part.options());
  for (const auto& ob : from.buckets) {
    if (ob.chunk == 0) continue;  // (alike on every rank: the layout is)
    // The old bucket whole, from every rank's chunk of it.
    at::Tensor mine =
        part.slice(0, ob.part_offset, ob.part_offset + ob.chunk).to(collective_device).contiguous();
    at::Tensor whole = at::empty({world * ob.chunk}, mine.options());
    group.all_gather(whole, mine).wait();
    if (whole.device() != out.device()) whole = whole.to(out.device());
    // Each of its parameters' elements that fall in this rank's chunk of their new bucket.
    for (int i : ob.params) {
      const auto& a = from.params[i];
      const auto& n = to.params[i];
      const auto& nb = to.buckets[n.bucket];
      const int64_t chunk_begin = nb.begin + rank * nb.chunk;
      const int64_t lo = std::max(n.offset, chunk_begin);
      const int64_t hi = std::min(n.offset + n.numel, chunk_begin + nb.chunk);
      if (lo >= hi) continue;
      const int64_t src = a.offset - ob.begin + (lo - n.offset);
      out.slice(0, nb.part_offset + lo - chunk_begin, nb.part_offset + hi - chunk_begin)
          .copy_(whole.slice(0, src, src + hi - lo));
    }
  }
  return out;
}

void relay_in_place(const FlatLayout& from, const FlatLayout& to, at::Tensor& t, bool partition,
                    int rank, comm::ProcessGroup& group, c10::Device collective_device) {
  const at::Tensor source = t.is_cpu() ? t : t.cpu();
  at::Tensor moved = partition ? relay_partition(from, to, source, rank, group, collective_device)
                               : relay_flat(from, to, source);
  // A host buffer takes the new tensor (it may be shared: stage 3's fp32 partition is its
  // 16-bit one on a CPU run in fp32, and is re-laid by its owner).
  if (t.is_cpu()) {
    t = moved;
  } else if (moved.numel() == t.numel()) {
    t.copy_(moved);
  } else {
    t = moved.to(t.device());
  }
}

}  // namespace dscpp::zero
