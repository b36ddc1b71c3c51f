// relay_flat, relay_partition, relay_in_place, relay_host_through: see relayout.h.
#include "dscpp/zero/relayout.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::zero {
namespace {

void check_same_params(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat) {
  if (from.params.size() != to.params.size() || flat.numel() != from.total)
    throw Error("relay_flat: layouts of different parameters, or a buffer of " +
                std::to_string(flat.numel()) + " elements for a layout of " +
                std::to_string(from.total));
}

// `out` (to.total elements) zeroed, then every parameter copied from its old place in flat.
void relay_flat_into(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat,
                     at::Tensor& out) {
  check_same_params(from, to, flat);
  out.zero_();
  for (size_t i = 0; i < to.params.size(); ++i) {
    const auto& a = from.params[i];
    const auto& b = to.params[i];
    out.slice(0, b.offset, b.offset + b.numel).copy_(flat.slice(0, a.offset, a.offset + a.numel));
  }
}

// `out` (to.partition elements, never part's storage) zeroed, then filled as relay_partition says.
void relay_partition_into(const FlatLayout& from, const FlatLayout& to, const at::Tensor& part,
                          at::Tensor& out, int rank, comm::ProcessGroup& group,
                          c10::Device collective_device) {
  if (from.world_size != to.world_size)
    throw Error("relay_partition: layouts of different world sizes");
  if (from.world_size == 1) return relay_flat_into(from, to, part, out);
  const int world = from.world_size;
  out.zero_();
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
}

// A copy of t on `device`, or nothing where the device has no room for it (the caller then
// takes the host path). The caching allocator has already freed its cache and retried. Both
// paths run the same collectives in the same order, so ranks of a group may take either.
std::optional<at::Tensor> copy_if_room(const at::Tensor& t, c10::Device device) {
  try {
    return t.to(device, /*non_blocking=*/false, /*copy=*/true);
  } catch (const c10::OutOfMemoryError&) {
    return std::nullopt;
  }
}

std::optional<at::Tensor> empty_if_room(int64_t numel, const at::TensorOptions& options) {
  try {
    return at::empty({numel}, options);
  } catch (const c10::OutOfMemoryError&) {
    return std::nullopt;
  }
}

at::Tensor relaid(const FlatLayout& from, const FlatLayout& to, const at::Tensor& t, bool partition,
                  int rank, comm::ProcessGroup& group, c10::Device collective_device) {
  return partition ? relay_partition(from, to, t, rank, group, collective_device)
                   : relay_flat(from, to, t);
}

}  // namespace

at::Tensor relay_flat(const FlatLayout& from, const FlatLayout& to, const at::Tensor& flat) {
  check_same_params(from, to, flat);
  at::Tensor out = at::empty({to.total}, flat.options());
  relay_flat_into(from, to, flat, out);
  return out;
}

at::Tensor relay_partition(const FlatLayout& from, const FlatLayout& to, const at::Tensor& part,
                           int rank, comm::ProcessGroup& group, c10::Device collective_device) {
  at::Tensor out = at::empty({to.partition}, part.options());
  relay_partition_into(from, to, part, out, rank, group, collective_device);
  return out;
}

void relay_in_place(const FlatLayout& from, const FlatLayout& to, at::Tensor& t, bool partition,
                    int rank, comm::ProcessGroup& group, c10::Device collective_device) {
  const int64_t new_size = partition ? to.partition : to.total;
  // An accelerator's buffer is re-laid there when a second copy fits (every collective of it
  // on one device; the host untouched: a 16-bit model of 9 B parameters is 18 GB, twice that
  // through the host beside an offloaded optimizer's 12 bytes a parameter did not fit).
  if (!t.is_cpu()) {
    std::optional<at::Tensor> out = empty_if_room(new_size, t.options());
    if (out) {
      if (partition) {
        relay_partition_into(from, to, t, *out, rank, group, collective_device);
      } else {
        relay_flat_into(from, to, t, *out);
      }
      if (out->numel() == t.numel()) {
        t.copy_(*out);
      } else {
        t = *out;
      }
      return;
    }
  }
  // Otherwise through the host, its chunks through the device a bucket at a time.
  const at::Tensor source = t.is_cpu() ? t : t.cpu();
  at::Tensor moved = relaid(from, to, source, partition, rank, group, collective_device);
  // A host buffer takes the new tensor (it may be shared: stage 3's fp32 partition is its
  // 16-bit one on a CPU run in fp32, and is re-laid by its owner).
  if (t.is_cpu()) {
    t = moved;
  } else if (moved.numel() == new_size && moved.numel() == t.numel()) {
    t.copy_(moved);
  } else {
    t = moved.to(t.device());
  }
}

bool relay_host_through(const FlatLayout& from, const FlatLayout& to, const at::Tensor& t,
                        bool partition, int rank, comm::ProcessGroup& group,
                        c10::Device collective_device, c10::Device scratch) {
  const int64_t old_size = partition ? from.partition : from.total;
  const int64_t new_size = partition ? to.partition : to.total;
  if (!t.is_cpu() || t.numel() != old_size || new_size != old_size) return false;
  std::optional<at::Tensor> staged = copy_if_room(t, scratch);
  if (!staged) return false;
  at::Tensor into = t;
  if (partition) {
    relay_partition_into(from, to, *staged, into, rank, group, collective_device);
  } else {
    relay_flat_into(from, to, *staged, into);
  }
  return true;
}

}  // namespace dscpp::zero
