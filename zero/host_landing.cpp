// HostLanding: see host_landing.h.
#include "dscpp/zero/host_landing.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "dscpp/ops/cpu_adam.h"
#include "dscpp/ops/cpu_parallel.h"
#include "dscpp/ops/sum_of_squares.h"

namespace dscpp::zero {

namespace {

int64_t bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

struct HostLanding::Worker {
  struct Chunk {
    int bucket;
    at::Tensor source;  // on the device until its copy is done (no stream owns it)
    at::Tensor host;    // where the copy lands: `into` itself, or a staging buffer
    at::Tensor into;    // the partition's slice
    bool straight;
    double scale;
    double* sumsq;                     // null: none
    std::optional<c10::Event> copied;  // a GPU: the copy down
  };

  c10::Device device;
  bool streams;
  std::optional<c10::Stream> copy_stream;

  mutable std::mutex mutex;
  std::condition_variable cv;
  std::deque<Chunk> queue;  // queued, not yet taken by the worker
  int pending = 0;          // queued or being landed
  int64_t device_held = 0;  // their device bytes
  std::exception_ptr error;
  bool stop = false;
  std::function<void(int)> on_landed;
  double copy_wait_ms = 0, add_ms = 0, sumsq_ms = 0, queue_wait_ms = 0;
  std::thread thread;

  explicit Worker(c10::Device d) : device(d), streams(!d.is_cpu()) {
    if (streams) {
      c10::impl::VirtualGuardImpl impl(device.type());
      copy_stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    }
    thread = std::thread([this] { loop(); });
  }
  ~Worker() {
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return pending == 0; });
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }

  void loop() {
    at::NoGradGuard no_grad;
    // The adds run beside backward: one core stays with the thread queuing its kernels.
    ops::cpu::limit_thread_team(ops::cpu::threads() - 1);
    for (;;) {
      Chunk c;
      std::function<void(int)> notify;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // (stop, and nothing left)
        c = std::move(queue.front());
        queue.pop_front();
        notify = on_landed;
      }
      const int64_t held = streams ? bytes(c.source) : 0;
      double wait_ms = 0, add = 0, squares = 0;
      std::exception_ptr failed;
      try {
        {
          PhaseTimer t(wait_ms);
          if (c.copied) c.copied->synchronize();
        }
        c.source = at::Tensor();  // (its copy is done: the device memory may go back)
        {
          PhaseTimer t(add);
          if (!c.straight) {
            // (a mixed-type in-place add widens as it reads: no temporary of the chunk's size)
            if (c.scale == 1.0)
              c.into.add_(c.host);
            else
              c.into.add_(c.host, c.scale);
          } else if (!c.host.is_same(c.into)) {
            c.into.copy_(c.host);  // (the CPU: the chunk is read where it is)
          }
          c.host = at::Tensor();
        }
        if (c.sumsq) {
          PhaseTimer t(squares);
          *c.sumsq = ops::host_sum_of_squares(c.into);
        }
      } catch (...) {
        failed = std::current_exception();
      }
      // (outside the lock: the callback takes the overlap's own)
      if (!failed && notify) {
        try {
          notify(c.bucket);
        } catch (...) {
          failed = std::current_exception();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        copy_wait_ms += wait_ms;
        add_ms += add;
        sumsq_ms += squares;
        if (failed && !error) error = failed;
        --pending;
        device_held -= held;
      }
      cv.notify_all();
    }
  }

  void rethrow_locked() {
    if (!error) return;
    std::exception_ptr e = error;
    error = nullptr;
    std::rethrow_exception(e);
  }
};

HostLanding::HostLanding(c10::Device device) : w_(std::make_unique<Worker>(device)) {}

HostLanding::~HostLanding() = default;

void HostLanding::land(int bucket, at::Tensor source, at::Tensor into, bool straight, double scale,
                       double* sumsq) {
  Worker& w = *w_;
  {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(w.mutex);
    w.cv.wait(lock, [&] { return w.pending < kMaxInFlight || w.error; });
    w.queue_wait_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    w.rethrow_locked();
  }
  at::NoGradGuard no_grad;
  Worker::Chunk c{bucket, std::move(source), at::Tensor(), std::move(into), straight, scale,
                  sumsq,  std::nullopt};
  if (!w.streams) {
    c.host = c.source;  // (the CPU: the worker reads the chunk where it is)
  } else {
    // A page-locked staging buffer where the chunk is added rather than copied (the caching
    // host allocator keeps them from step to step).
    c.host = straight
                 ? c.into
                 : at::empty({c.source.numel()},
                             c.source.options().device(at::kCPU).pinned_memory(c.into.is_pinned()));
    c10::impl::VirtualGuardImpl impl(c.source.device().type());
    const c10::Stream compute = impl.getStream(c.source.device());
    // The copy stream waits on an event rather than the host on the reduction: the host goes on
    // queuing backward's kernels.
    c10::Event reduced(c.source.device().type());
    reduced.record(compute);
    reduced.block(*w.copy_stream);
    const c10::Stream previous = impl.exchangeStream(*w.copy_stream);
    try {
      c.host.copy_(c.source, /*non_blocking=*/true);
    } catch (...) {
      impl.exchangeStream(previous);
      throw;
    }
    impl.exchangeStream(previous);
    c.copied.emplace(c.source.device().type());
    c.copied->record(*w.copy_stream);
  }
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    ++w.pending;
    w.device_held += w.streams ? bytes(c.source) : 0;
    w.queue.push_back(std::move(c));
  }
  w.cv.notify_all();
}

void HostLanding::drain() {
  Worker& w = *w_;
  std::unique_lock<std::mutex> lock(w.mutex);
  w.cv.wait(lock, [&] { return w.pending == 0; });
  w.rethrow_locked();
}

void HostLanding::set_on_landed(std::function<void(int)> fn) {
  std::lock_guard<std::mutex> lock(w_->mutex);
  w_->on_landed = std::move(fn);
}

int64_t HostLanding::device_bytes() const {
  std::lock_guard<std::mutex> lock(w_->mutex);
  return w_->device_held;
}

void HostLanding::take_times(PhaseTimes& times) {
  std::lock_guard<std::mutex> lock(w_->mutex);
  take_phase(times, "landing.copy_wait", w_->copy_wait_ms);
  take_phase(times, "landing.add", w_->add_ms);
  take_phase(times, "landing.sumsq", w_->sumsq_ms);
  take_phase(times, "landing.queue_wait", w_->queue_wait_ms);
}

}  // namespace dscpp::zero
