// ZeRO-Offload of the optimizer (offload_optimizer.device = "cpu", docs/architecture.md
// "Master partition and offload"): the fp32 master and the optimizer state live in host memory; at
// the step each bucket's reduced gradient chunk comes down from the training device, the CPU
// optimizer (ops/cpu_adam.h) updates it sub_group_size elements at a time, and the updated 16-bit
// chunk goes back up to where the parameter store publishes it from. On a GPU the copies run on a
// copy stream through two pinned staging slots, so the next piece's gradients come down while
// the CPU updates this one and the last piece goes up; on the CPU the same calls are plain
// copies. The gradient partition is on the device, where the reductions land, or in host memory
// (OffloadOptions::host_gradients), where the chunks landed during backward and are read in
// place.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <vector>

#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/master_partition.h"
#include "dscpp/zero/phase_times.h"

namespace dscpp::zero {

struct OffloadOptions {
  bool enabled = false;    // offload_optimizer.device == "cpu" (and the old cpu_offload: true)
  bool pin_memory = true;  // the staging slots in page-locked memory (only where a GPU is)
  int64_t sub_group_size = 1000000000;  // elements the CPU optimizer steps at a time
  // offload_optimizer.ratio (stage 3): the share of the partition on the host, by sub-groups
  // of sub_group_size (MasterPartition's HostShare); the rest stays and steps on the device.
  double ratio = 1.0;
  // offload_optimizer.device = "nvme" (ZeRO-Infinity): the host part in files, swapped in
  // per piece (zero/nvme_swap.h, through MasterPartition).
  NvmeOptions nvme;
  // The gradient partition in host memory too (with ratio 1), the reduced buckets copied down
  // as they complete (GradBuckets), as DeepSpeed's ZeRO-Offload keeps no gradient partition on
  // the device. false: on the device, for whoever runs collectives over it (tensor
  // parallelism's and a pipeline's tied-weight reductions).
  bool host_gradients = true;
};

// What both ways of stepping an offloaded partition are built from (OffloadStepper here, which
// steps after backward, and OffloadOverlap in offload_overlap.h, which steps during it), checked
// once: the owner's layout (final by the time the parts exist); the device of the gradient
// partition and of the 16-bit parameters; their types (the staging slots'); the options.
class OffloadTarget {
 protected:
  OffloadTarget(const FlatLayout& layout, c10::Device device, at::ScalarType grad_dtype,
                at::ScalarType param_dtype, OffloadOptions options);

  const FlatLayout& layout_;
  c10::Device device_;
  at::ScalarType grad_dtype_, param_dtype_;
  OffloadOptions options_;
};

class OffloadStepper : private OffloadTarget {
 public:
  // device: where the gradient partition and the 16-bit parameters are. grad_dtype /
  // param_dtype: their types (the staging slots').
  OffloadStepper(const FlatLayout& layout, c10::Device device, at::ScalarType grad_dtype,
                 at::ScalarType param_dtype, OffloadOptions options);
  ~OffloadStepper();

  // One step of every bucket in `order`: master.begin_bucket_updates() must have run. scale:
  // what the gradients are multiplied by (any device). destination(b): the device chunk bucket
  // b's 16-bit copy goes to; done(b) is called once b's copy is there in stream order (the
  // publish follows).
  void step(MasterPartition& master, const std::vector<int>& order, const at::Tensor& scale,
            const std::function<at::Tensor(int)>& destination,
            const std::function<void(int)>& done);

  // Elements each staging slot holds (the largest piece of the last step).
  int64_t piece_numel() const { return piece_; }
  int64_t staging_bytes() const;  // the staging slots (host memory)
  // Host time of the steps since the last call (phase_times.h): offload.scale_read (the step's
  // scale brought to the host: a GPU's queued work waited for), offload.cpu_update (the CPU
  // optimizer), offload.copy_wait (waits for staging copies down or up), offload.publish (the
  // buckets' publishes), offload.device_update (a partial offload's device pieces queued).
  void take_phase_times(PhaseTimes& times);

 private:
  struct Transfers;  // the staging slots, and the copy stream and events where the device has them
  int64_t piece_ = 0;
  std::unique_ptr<Transfers> transfers_;
  double scale_read_ms_ = 0, cpu_update_ms_ = 0, copy_wait_ms_ = 0, publish_ms_ = 0,
         device_update_ms_ = 0;
};

}  // namespace dscpp::zero
