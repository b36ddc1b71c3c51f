// OffloadOverlap: see offload_overlap.h.
#include "dscpp/zero/offload_overlap.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "dscpp/error.h"
#include "dscpp/ops/cpu_adam.h"
#include "dscpp/ops/cpu_parallel.h"
#include "dscpp/ops/pinned_memory.h"

namespace dscpp::zero {

namespace {

// The same memory with a version counter of its own (offload_overlap.h says why).
at::Tensor unversioned_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options());
}

}  // namespace

// The worker thread and what it shares with the training thread. Where the device has streams
// (a GPU), the worker's copies run on a copy stream of its own (its thread's current stream),
// after an event the training thread recorded once the bucket was reduced; on the CPU the
// worker reads the gradient partition and writes the destination directly.
struct OffloadOverlap::Worker {
  struct Slot {
    at::Tensor grad, copy;               // pinned host staging
    std::optional<c10::Event> down, up;  // the slot's last copy down / up
  };
  c10::Device device;
  bool streams;
  bool pin;
  std::optional<c10::Stream> copy_stream;
  Slot slots[2];
  int64_t piece = 0;
  int next_slot = 0;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<int> queue;
  std::vector<char> done;
  std::vector<std::optional<c10::Event>> reduced_events, done_events;
  std::exception_ptr error;
  bool stop = false;
  // This step's job (set by begin() while the worker is idle).
  const FlatLayout* layout = nullptr;
  MasterPartition* master = nullptr;
  at::Tensor scale;
  std::vector<at::Tensor> destinations;
  std::atomic<bool>* ended = nullptr;
  int started_early = 0;
  double update_ms = 0, copy_wait_ms = 0;  // (the worker's; read under the mutex)
  std::thread thread;

  Worker(c10::Device d, bool pin_memory) : device(d), streams(!d.is_cpu()), pin(pin_memory) {
    if (streams) {
      c10::impl::VirtualGuardImpl impl(device.type());
      copy_stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    }
    thread = std::thread([this] { loop(); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }

  void size_slots(int64_t n, at::ScalarType grad_dtype, at::ScalarType param_dtype) {
    if (n == piece) return;
    if (!streams) {
      piece = n;
      return;
    }
    for (Slot& s : slots) {
      if (s.up) s.up->synchronize();
      s = Slot{ops::host_empty(n, grad_dtype, pin), ops::host_empty(n, param_dtype, pin),
               std::nullopt, std::nullopt};
    }
    piece = n;
  }

  void loop() {
    at::NoGradGuard no_grad;
    // One core stays with the thread that queues backward's kernels (cpu_parallel.h says why).
    ops::cpu::limit_thread_team(ops::cpu::threads() - 1);
    std::optional<c10::DeviceGuard> guard;
    if (streams) {
      guard.emplace(device);
      c10::impl::VirtualGuardImpl(device.type()).exchangeStream(*copy_stream);
    }
    for (;;) {
      int b;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stop || (!queue.empty() && !error); });
        if (stop) return;
        b = queue.front();
        queue.pop_front();
        if (!ended->load()) ++started_early;
      }
      double update_time = 0, copy_wait = 0;
      try {
        update(b, update_time, copy_wait);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        done[b] = 1;
        update_ms += update_time;
        copy_wait_ms += copy_wait;
      }
      cv.notify_all();
    }
  }

  static void record(std::optional<c10::Event>& e, const c10::Stream& stream) {
    if (!e) e.emplace(stream.device_type());
    e->record(stream);
  }

  // Bucket b's chunk, in pieces of at most `piece` elements (sub_group_size).
  void update(int b, double& update_ms, double& copy_wait_ms) {
    const auto& bucket = layout->buckets[b];
    at::Tensor dst = unversioned_alias(destinations[b]);
    std::optional<c10::Event> reduced;
    {
      std::lock_guard<std::mutex> lock(mutex);
      reduced = std::move(reduced_events[b]);
    }
    if (reduced) reduced->block(*copy_stream);
    const int64_t step = piece;
    for (int64_t o = 0; o < bucket.chunk; o += step) {
      const int64_t len = std::min(step, bucket.chunk - o);
      at::Tensor grad = master->grads().narrow(0, bucket.part_offset + o, len);
      at::Tensor out = dst.narrow(0, o, len);
      if (!streams) {
        PhaseTimer t(update_ms);
        master->update_piece(b, o, grad, scale, out);
        continue;
      }
      Slot& s = slots[next_slot];
      next_slot ^= 1;
      if (s.up) {
        PhaseTimer t(copy_wait_ms);
        s.up->synchronize();  // its last copy up has left
      }
      at::Tensor host_copy = s.copy.narrow(0, 0, len);
      at::Tensor host_grad = grad;  // a host gradient partition: landed there already
      if (!grad.is_cpu()) {
        host_grad = s.grad.narrow(0, 0, len);
        host_grad.copy_(grad, /*non_blocking=*/true);
        record(s.down, *copy_stream);
        PhaseTimer t(copy_wait_ms);
        s.down->synchronize();
      }
      {
        PhaseTimer t(update_ms);
        master->update_piece(b, o, host_grad, scale, host_copy);
      }
      out.copy_(host_copy, /*non_blocking=*/true);
      record(s.up, *copy_stream);
    }
    if (streams) {
      std::optional<c10::Event> e;
      record(e, *copy_stream);
      std::lock_guard<std::mutex> lock(mutex);
      done_events[b] = std::move(e);
    }
  }
};

OffloadOverlap::OffloadOverlap(const FlatLayout& layout, c10::Device device,
                               at::ScalarType grad_dtype, at::ScalarType param_dtype,
                               OffloadOptions options)
    : OffloadTarget(layout, device, grad_dtype, param_dtype, options) {}

OffloadOverlap::~OffloadOverlap() = default;

int64_t OffloadOverlap::staging_bytes() const {
  if (!worker_) return 0;
  int64_t n = 0;
  for (const auto& s : worker_->slots)
    n += (s.grad.defined() ? s.grad.nbytes() : 0) + (s.copy.defined() ? s.copy.nbytes() : 0);
  return n;
}

void OffloadOverlap::begin(MasterPartition& master, at::Tensor scale,
                           std::vector<at::Tensor> destinations) {
  if (active_) throw Error("OffloadOverlap: a step is already under way");
  const size_t n = layout_.buckets.size();
  if (destinations.size() != n) throw Error("OffloadOverlap: one destination per bucket");
  if (!worker_) worker_ = std::make_unique<Worker>(device_, options_.pin_memory);
  int64_t largest = 0;
  for (const auto& b : layout_.buckets) largest = std::max(largest, b.chunk);
  worker_->size_slots(std::max<int64_t>(1, std::min(largest, options_.sub_group_size)), grad_dtype_,
                      param_dtype_);
  master.begin_bucket_updates();
  backward_ended_ = false;
  std::lock_guard<std::mutex> lock(worker_->mutex);
  Worker& w = *worker_;
  w.layout = &layout_;
  w.master = &master;
  w.scale = std::move(scale);
  w.destinations = std::move(destinations);
  w.ended = &backward_ended_;
  w.started_early = 0;
  w.error = nullptr;
  w.queue.clear();
  w.done.assign(n, 0);
  w.reduced_events.clear();
  w.reduced_events.resize(n);
  w.done_events.clear();
  w.done_events.resize(n);
  active_ = true;
}

void OffloadOverlap::reduced(int b) {
  if (!active_) return;
  Worker& w = *worker_;
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    // (a host gradient partition: the chunk has landed, and this runs on the landing's worker,
    // whose current stream orders nothing)
    if (w.streams && !w.master->grads().is_cpu()) {
      c10::impl::VirtualGuardImpl impl(device_.type());
      Worker::record(w.reduced_events[b], impl.getStream(device_));
    }
    w.queue.push_back(b);
  }
  w.cv.notify_all();
}

void OffloadOverlap::wait(int b) {
  Worker& w = *worker_;
  std::optional<c10::Event> e;
  PhaseTimer timer(wait_ms_);
  {
    std::unique_lock<std::mutex> lock(w.mutex);
    w.cv.wait(lock, [&] { return w.done[b] || w.error; });
    if (w.error) {
      active_ = false;
      std::rethrow_exception(w.error);
    }
    e = std::move(w.done_events[b]);
  }
  if (e) e->block(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
}

void OffloadOverlap::finish() {
  Worker& w = *worker_;
  std::lock_guard<std::mutex> lock(w.mutex);
  started_early_ += w.started_early;
  ++steps_;
  w.destinations.clear();
  w.scale = at::Tensor();
  active_ = false;
}

void OffloadOverlap::take_phase_times(PhaseTimes& times) {
  if (worker_) {
    std::lock_guard<std::mutex> lock(worker_->mutex);
    take_phase(times, "overlap.cpu_update", worker_->update_ms);
    take_phase(times, "overlap.copy_wait", worker_->copy_wait_ms);
  }
  take_phase(times, "overlap.wait", wait_ms_);
}

}  // namespace dscpp::zero
