// ZeRO-Offload overlapped with backward (stages 1-2, docs/OFFLOAD.md "Overlap"): during the
// last backward of an accumulation window, as soon as a bucket's reduced gradients have landed
// in the gradient partition, a worker thread brings them down (on a GPU through two pinned
// slots on a copy stream), the CPU optimizer updates that bucket's chunk of the master, and its
// 16-bit chunk goes back up to where the parameter store publishes it from, while backward goes
// on with the earlier layers. The step then only waits for each bucket and publishes it. The
// worker's CPU optimizer runs on one thread fewer than LibTorch's count (ops/cpu_parallel.h's
// limit_thread_team), leaving a core to the thread that queues backward's kernels.
//
// Only for a step whose gradient scale is known before backward: no gradient clipping and no
// overflow check (fp16), where the global norm would have to be complete before any update
// (DeepSpeed's ZeRO-Offload overlaps only the gradient copies then; so do we not at all: the
// step's own pipelined copies run after backward, zero/offload.h). The updated chunk is written
// through an alias of the destination that does not bump the parameters' version counter: the
// bucket's parameters have had every gradient of this backward, so no autograd node still to
// run reads them (a bump would make every saved parameter of the flat buffer look modified).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <memory>
#include <vector>

#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/master_partition.h"
#include "dscpp/zero/offload.h"
#include "dscpp/zero/phase_times.h"

namespace dscpp::zero {

class OffloadOverlap : private OffloadTarget {
 public:
  OffloadOverlap(const FlatLayout& layout, c10::Device device, at::ScalarType grad_dtype,
                 at::ScalarType param_dtype, OffloadOptions options);
  ~OffloadOverlap();  // stops the worker (after the bucket it is on)

  // At the start of the window's last backward. Calls master.begin_bucket_updates() (the step
  // count and hyper-parameters of this step are fixed here). scale: the step's gradient scale,
  // a 0-dim fp32 host tensor. destinations[b]: where bucket b's updated 16-bit chunk goes.
  void begin(MasterPartition& master, at::Tensor scale, std::vector<at::Tensor> destinations);
  bool active() const { return active_; }
  // Bucket b's gradients are final in master.grads() (on a GPU: in the current stream's order).
  void reduced(int b);
  // Backward has returned: updates that start from now on are not counted as overlapped.
  void backward_ended() { backward_ended_ = true; }
  // Waits for bucket b's update (on a GPU the current stream waits for its copy up; the host
  // waits for the CPU update). Rethrows the worker's error.
  void wait(int b);
  // After every bucket was waited for: the step is over.
  void finish();
  // Since construction: bucket updates that started before backward_ended(), and steps run.
  int64_t started_during_backward() const { return started_early_; }
  int64_t steps() const { return steps_; }
  int64_t staging_bytes() const;  // the staging slots (host memory)
  // Host time since the last call (phase_times.h): overlap.cpu_update and overlap.copy_wait
  // (the worker's CPU optimizer and its waits for copies), overlap.wait (the step waiting for
  // the worker's buckets).
  void take_phase_times(PhaseTimes& times);

 private:
  struct Worker;  // the thread, its queue, the staging slots and the copy stream
  bool active_ = false;
  std::atomic<bool> backward_ended_{false};
  int64_t started_early_ = 0, steps_ = 0;
  double wait_ms_ = 0;
  std::unique_ptr<Worker> worker_;
};

}  // namespace dscpp::zero
