// OffloadStepper: see offload.h.
#include "dscpp/zero/offload.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <optional>

#include "dscpp/error.h"
#include "dscpp/ops/pinned_memory.h"

namespace dscpp::zero {

namespace {

// One piece of the step: elements [offset, offset + length) of bucket b's chunk.
struct Piece {
  int bucket;
  int64_t offset, length;
  bool on_device;  // partial offload: in the partition's head, updated on the device
};

}  // namespace

// Two staging slots, each a piece of gradient coming down and a piece of 16-bit parameters
// going up. Where the device has streams (a GPU), the copies run on a copy stream and are
// ordered by events; on the CPU there is no stream and every copy is done when it returns.
struct OffloadStepper::Transfers {
  struct Slot {
    at::Tensor grad, copy;               // host staging
    std::optional<c10::Event> down, up;  // the slot's last copy down / up (GPU only)
  };
  c10::Device device;
  bool streams;
  std::optional<c10::Stream> copy_stream;
  Slot slots[2];

  Transfers(c10::Device d, int64_t piece, at::ScalarType grad_dtype, at::ScalarType param_dtype,
            bool pin)
      : device(d), streams(!d.is_cpu()) {
    for (Slot& s : slots) {
      s.grad = ops::host_empty(piece, grad_dtype, streams && pin);
      s.copy = ops::host_empty(piece, param_dtype, streams && pin);
    }
    if (streams) {
      c10::impl::VirtualGuardImpl impl(device.type());
      copy_stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    }
  }

  c10::Stream current() const {
    return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  }
  // Runs fn with the copy stream current (a GPU), or as it is (the CPU).
  template <typename F>
  void on_copy_stream(F&& fn) {
    if (!streams) {
      fn();
      return;
    }
    c10::impl::VirtualGuardImpl impl(device.type());
    const c10::Stream previous = impl.exchangeStream(*copy_stream);
    try {
      fn();
    } catch (...) {
      impl.exchangeStream(previous);
      throw;
    }
    impl.exchangeStream(previous);
  }
  static void record(std::optional<c10::Event>& e, const c10::Stream& stream) {
    if (!e) e.emplace(stream.device_type());
    e->record(stream);
  }

  // The copy stream starts after everything queued on the compute stream so far (the
  // reductions into the gradient partition, the norm).
  void begin() {
    if (!streams) return;
    c10::Event reduced(device.type());
    reduced.record(current());
    reduced.block(*copy_stream);
  }
  void down(Slot& s, const at::Tensor& grad) {
    at::Tensor dst = s.grad.narrow(0, 0, grad.numel());
    on_copy_stream([&] { dst.copy_(grad, /*non_blocking=*/streams); });
    if (streams) record(s.down, *copy_stream);
  }
  void wait_down(Slot& s) {
    if (s.down) s.down->synchronize();
  }
  // Before the host writes a slot's copy again: its last copy up has left.
  void wait_up(Slot& s) {
    if (s.up) s.up->synchronize();
  }
  void up(Slot& s, const at::Tensor& destination, int64_t length) {
    at::Tensor src = s.copy.narrow(0, 0, length);
    on_copy_stream([&] { destination.copy_(src, /*non_blocking=*/streams); });
    if (streams) record(s.up, *copy_stream);
  }
  // The compute stream (and the collectives queued behind it) waits for the copies up so far.
  void publish_after_up(Slot& s) {
    if (s.up) s.up->block(current());
  }
};

OffloadTarget::OffloadTarget(const FlatLayout& layout, c10::Device device,
                             at::ScalarType grad_dtype, at::ScalarType param_dtype,
                             OffloadOptions options)
    : layout_(layout),
      device_(device),
      grad_dtype_(grad_dtype),
      param_dtype_(param_dtype),
      options_(options) {
  if (options_.sub_group_size <= 0) throw Error("offload: sub_group_size must be positive");
}

OffloadStepper::OffloadStepper(const FlatLayout& layout, c10::Device device,
                               at::ScalarType grad_dtype, at::ScalarType param_dtype,
                               OffloadOptions options)
    : OffloadTarget(layout, device, grad_dtype, param_dtype, options) {}

OffloadStepper::~OffloadStepper() = default;

int64_t OffloadStepper::staging_bytes() const {
  if (!transfers_) return 0;
  int64_t n = 0;
  for (const auto& s : transfers_->slots) n += s.grad.nbytes() + s.copy.nbytes();
  return n;
}

void OffloadStepper::step(MasterPartition& master, const std::vector<int>& order,
                          const at::Tensor& scale,
                          const std::function<at::Tensor(int)>& destination,
                          const std::function<void(int)>& done) {
  int64_t largest = 0;
  for (const auto& b : layout_.buckets) largest = std::max(largest, b.chunk);
  const int64_t piece = std::max<int64_t>(1, std::min(largest, options_.sub_group_size));
  // The slots are sized by the layout's largest piece.
  if (!transfers_ || piece != piece_) {
    transfers_.reset();
    transfers_ =
        std::make_unique<Transfers>(device_, piece, grad_dtype_, param_dtype_, options_.pin_memory);
    piece_ = piece;
  }
  // Partial offload: the partition's head [0, cut) is updated where it is, on the device,
  // straight from the gradient partition into the destination; a piece never straddles it.
  const int64_t cut = master.split() ? master.host_begin() : 0;
  std::vector<Piece> pieces;
  for (int b : order) {
    const auto& bucket = layout_.buckets[b];
    const int64_t chunk = bucket.chunk;
    for (int64_t o = 0; o < chunk;) {
      int64_t len = std::min(piece_, chunk - o);
      const int64_t at_ = bucket.part_offset + o;
      if (at_ < cut && at_ + len > cut) len = cut - at_;
      pieces.push_back({b, o, len, at_ + len <= cut});
      o += len;
    }
    if (chunk == 0) pieces.push_back({b, 0, 0, false});
  }
  at::Tensor host_scale;
  {
    PhaseTimer timer(scale_read_ms_);
    host_scale = scale.to(at::kCPU);  // one read for the whole step
  }
  Transfers& t = *transfers_;
  auto grad_of = [&](const Piece& p) {
    const int64_t at_ = layout_.buckets[p.bucket].part_offset + p.offset;
    return master.grads().narrow(0, at_, p.length);
  };
  std::vector<size_t> host_pieces;  // the pieces that go through the staging slots
  for (size_t i = 0; i < pieces.size(); ++i)
    if (!pieces[i].on_device) host_pieces.push_back(i);
  // NVMe: the host pieces' reads start now, in this order.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i : host_pieces) {
    const int64_t at_ = layout_.buckets[pieces[i].bucket].part_offset + pieces[i].offset;
    ranges.emplace_back(at_, at_ + pieces[i].length);
  }
  master.plan_pieces(ranges);
  t.begin();
  // A host gradient partition (GradBuckets landed it there): read where it is, nothing comes
  // down.
  const bool grads_on_host = master.grads().is_cpu();
  if (!host_pieces.empty() && !grads_on_host) t.down(t.slots[0], grad_of(pieces[host_pieces[0]]));
  size_t k = 0;  // host pieces done
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    at::Tensor dst = destination(p.bucket).narrow(0, p.offset, p.length);
    const bool last_of_bucket = i + 1 == pieces.size() || pieces[i + 1].bucket != p.bucket;
    if (p.on_device) {
      {
        PhaseTimer timer(device_update_ms_);
        master.update_piece(p.bucket, p.offset, grad_of(p), scale, dst);
      }
      if (last_of_bucket) {
        PhaseTimer timer(publish_ms_);
        done(p.bucket);
      }
      continue;
    }
    auto& slot = t.slots[k % 2];
    // The next host piece comes down while this one is updated.
    if (k + 1 < host_pieces.size() && !grads_on_host)
      t.down(t.slots[(k + 1) % 2], grad_of(pieces[host_pieces[k + 1]]));
    ++k;
    {
      PhaseTimer timer(copy_wait_ms_);
      t.wait_down(slot);
      t.wait_up(slot);
    }
    at::Tensor copy = slot.copy.narrow(0, 0, p.length);
    const at::Tensor grad = grads_on_host ? grad_of(p) : slot.grad.narrow(0, 0, p.length);
    {
      PhaseTimer timer(cpu_update_ms_);
      master.update_piece(p.bucket, p.offset, grad, host_scale, copy);
    }
    t.up(slot, dst, p.length);
    // (a bucket's device pieces come first: its last piece is a host one if any is)
    if (last_of_bucket) {
      PhaseTimer timer(publish_ms_);
      t.publish_after_up(slot);
      done(p.bucket);
    }
  }
  // The slots' last copies up have left before the host may reuse them next step.
  {
    PhaseTimer timer(copy_wait_ms_);
    for (auto& s : t.slots) t.wait_up(s);
  }
  master.finish_pieces();
}

void OffloadStepper::take_phase_times(PhaseTimes& times) {
  take_phase(times, "offload.scale_read", scale_read_ms_);
  take_phase(times, "offload.cpu_update", cpu_update_ms_);
  take_phase(times, "offload.copy_wait", copy_wait_ms_);
  take_phase(times, "offload.publish", publish_ms_);
  if (device_update_ms_ > 0) take_phase(times, "offload.device_update", device_update_ms_);
}

}  // namespace dscpp::zero
