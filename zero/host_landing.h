// Reduced gradient chunks landing in a host gradient partition (ZeRO-Offload, grad_buckets.h),
// off the thread that runs backward. land() queues a chunk and returns: on a GPU its copy down
// runs on a copy stream behind an event on the current (compute) stream, so the thread that
// queues backward's kernels never waits for a copy (waiting for each chunk's copy and doing each
// host add itself held backward up, docs/perf-log/2026-12-03.md); a worker thread waits for
// the copies in queue order, adds each chunk into its place in the partition where it was not
// copied straight there, and then reports the bucket landed. On the CPU the worker copies (or
// adds) the chunk itself.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>

#include "dscpp/zero/phase_times.h"

namespace dscpp::zero {

class HostLanding {
 public:
  // device: where the chunks come from (on a GPU a copy stream of its pool carries them down).
  explicit HostLanding(c10::Device device);
  ~HostLanding();  // waits for what is queued (its errors are dropped), then stops the worker

  // Bucket b's reduced chunk `source` (on the device) goes into `into` (its slice of the host
  // partition): copied there when `straight` (same type, nothing to add to), else brought into
  // a staging buffer (page-locked when `into` is) and added, times `scale` unless it is 1.
  // sumsq (null: none): where the worker writes the sum of the squares of `into` once the chunk
  // is in it (ops::host_sum_of_squares), before the bucket is reported: the norm's share of a
  // final gradient, summed while backward goes on instead of in a pass over the whole partition
  // at the step. First waits while kMaxInFlight chunks have not landed (each holds its device
  // memory until it has). Rethrows an earlier chunk's error.
  void land(int bucket, at::Tensor source, at::Tensor into, bool straight, double scale,
            double* sumsq = nullptr);
  // Waits until every chunk queued so far has landed; rethrows the first error since the last.
  void drain();
  // Called on the worker with b once bucket b is in the partition, in queue order (empty: none).
  // Set it only while nothing is queued.
  void set_on_landed(std::function<void(int)> fn);
  // Device bytes held by the chunks queued and not landed yet.
  int64_t device_bytes() const;
  // Phase times (phase_times.h) since the last take: landing.copy_wait (the worker waiting for
  // copies down), landing.add (its adds and copies on the host), landing.sumsq (its sums of
  // squares), landing.queue_wait (land() waiting for room: the backward's thread).
  void take_times(PhaseTimes& times);

  static constexpr int kMaxInFlight = 2;

 private:
  struct Worker;
  std::unique_ptr<Worker> w_;
};

}  // namespace dscpp::zero
