// ZeRO's master partition (docs/architecture.md, "Master partition and offload"): this rank's fp32
// copy of its chunks of every bucket, the gradient partition that GradBuckets reduce into, and the
// optimizer state over them (one optimizer shard per parameter group, each group's chunks
// contiguous in the partition). With offload (zero/offload.h) the master and the optimizer
// state live in host memory while the gradient partition stays on the device, and the update
// goes piece by piece from gradients brought down. With partial offload (DeepSpeed's
// offload_optimizer.ratio < 1) only the partition's tail [host_begin(), partition) is on the
// host; its head stays on the device with an optimizer of its own (the given one's make_like,
// its hyper-parameters copied from the given one at every step), one shard per group there too.
// With NVMe offload (ZeRO-Infinity, zero/nvme_swap.h) the master and the optimizer state live
// in files instead: the optimizer's shards are empty (they keep the hyper-parameters, the step
// count and the state's names), each piece is stepped in a swap buffer read ahead and written
// behind, and whole(), assign(), state_partition() and load_state_partition() read and write
// the files, so checkpoints go through here as without it.
// The step's arithmetic on the partition lives here; where the results go is the parameter
// store's business.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/memory_breakdown.h"
#include "dscpp/zero/nvme_swap.h"

namespace dscpp::zero {

// Which part of an offloaded partition goes to the host (offload_optimizer.ratio). As in
// DeepSpeed's stage 3 (_create_fp32_partitions): the partition is cut into sub-groups of
// sub_group_size elements, the first int((1 - ratio) * count) stay on the device, the rest
// go to the host. ratio 1: all of it on the host.
struct HostShare {
  double ratio = 1.0;
  int64_t sub_group_size = 1000000000;
  int64_t host_begin(int64_t partition) const;
};

class MasterPartition {
 public:
  // options: the training device (its dtype is ignored: the master is fp32). grad_dtype: the
  // gradient partition's type (fp32, or the 16-bit training type). on_host: the master (and so
  // the optimizer state) in host memory, the gradient partition on options' device (offload),
  // all of it or the share `share` says. nvme (with on_host, the whole share): the host part
  // in files instead (an elementwise optimizer only). grads_on_host (with on_host, the whole
  // partition there): the gradient partition in host memory too (page-locked with pin_grads),
  // where the reductions land bucket by bucket (GradBuckets), as DeepSpeed's ZeRO-Offload keeps
  // no gradient partition on the device. The layout must outlive it.
  MasterPartition(const FlatLayout& layout, at::TensorOptions options,
                  std::unique_ptr<optim::Optimizer> optimizer, at::ScalarType grad_dtype,
                  bool on_host = false, HostShare share = {}, const NvmeOptions* nvme = nullptr,
                  bool grads_on_host = false, bool pin_grads = false);
  // One optimizer shard per parameter group (group_options[g] over the optimizer's
  // defaults). Separate from construction so that stage 3 can release its 16-bit model before
  // the optimizer state exists.
  void add_shards(const std::vector<optim::Hyper>& group_options);
  // The whole fp32 master: the tensor itself where it is one (writes reach it), else (partial
  // offload on a GPU: two devices) a host copy, which assign() writes back.
  at::Tensor whole();
  void assign(const at::Tensor& values);
  // The first partition element on the host (partition() when none is; 0 when all are).
  int64_t host_begin() const { return host_begin_; }
  bool split() const { return device_opt_ != nullptr; }
  // Options of the given optimizer's side (the host with offload): where scales are made.
  at::TensorOptions options() const { return primary_.options(); }
  // The gradient partition. On one rank at stages 0-1 with accumulation it may also be
  // GradBuckets' flat gradient buffer (ZeroOptions::alias_grad_partition): the parameters'
  // .grad are then views of it, and clear_gradients(true) is what empties that buffer.
  const at::Tensor& grads() const { return grads_; }
  at::Tensor& grads() { return grads_; }
  bool grads_on_host() const { return grads_on_host_; }
  // Every buffer this part holds (memory_breakdown.h's names: grad_partition, fp32_master,
  // optimizer.<state>).
  void add_memory(MemoryBreakdown& m) const;
  optim::Optimizer& optimizer() { return *optimizer_; }

  // This rank's part of the global sum of squares: one pass over the gradient partition (a
  // 16-bit one widened as it is read, accumulated in fp32), no temporary of its size. 0-dim fp32.
  at::Tensor local_sumsq() const;
  // Multiplies an fp32 gradient partition by scale in place, unless every optimizer applies
  // the scale as it reads the gradient (a pass over the partition saved).
  void apply_scale(const at::Tensor& scale);
  // The whole update: every shard from its gradient.
  void update(const at::Tensor& scale);
  // Stages 1-2 with an elementwise optimizer, bucket by bucket: begin_bucket_updates() once,
  // then update_bucket(b) writes bucket b's updated chunk, cast, into copy16 too.
  void begin_bucket_updates();
  void update_bucket(int b, const at::Tensor& scale, const at::Tensor& copy16);
  // Offload: elements [offset, offset + grad.numel()) of bucket b's chunk from grad (a host
  // copy of that range of the gradient partition for the host part; the gradient partition's
  // own range for the device part of a partial offload; a range is on one side only), the
  // updated parameters into copy16.
  void update_piece(int b, int64_t offset, const at::Tensor& grad, const at::Tensor& scale,
                    const at::Tensor& copy16);
  // NVMe offload: the host ranges update_piece() will be given, in that order (their reads
  // start now, ahead of the updates), and the end of them (every write on the disk). No-ops
  // without NVMe.
  void plan_pieces(const std::vector<std::pair<int64_t, int64_t>>& ranges);
  void finish_pieces();
  NvmeSwapper* swapper() { return swap_.get(); }
  // An update the device skipped (a non-finite scale): only the step count moved; take it back.
  void undo_step_count();
  // After a step (or an overflow's skip). zero: whether the gradient partition must be zeroed
  // (not when the next reduction overwrites it whole).
  void clear_gradients(bool zero);

  // An optimizer state (or the step count) over the whole partition, whatever the number of
  // groups: what checkpoints save and load.
  at::Tensor state_partition(const std::string& name);
  void load_state_partition(const std::string& name, const at::Tensor& values);
  std::vector<std::string> state_names();
  int64_t step_count() { return optimizer_->step_count(0); }
  void set_step_count(int64_t steps);

 private:
  // One optimizer and the partition range [begin, end) its shards cover, in `master`.
  struct Side {
    optim::Optimizer* opt;
    at::Tensor master;
    int64_t begin, end;
  };
  std::vector<Side> sides();  // the device side first (partition order)
  Side side_of(int64_t begin, int64_t end);
  // Group g's part of a side, in its master's coordinates: [lo, hi).
  std::pair<int64_t, int64_t> shard_range(const Side& s, int g) const;
  // Elements [begin, end) of the partition, of group g, from grad (already on s's device).
  void update_range(int g, int64_t begin, const at::Tensor& grad, const at::Tensor& scale,
                    const at::Tensor& copy16);
  // The gradient as s's optimizer takes it, and the scale to give it (undefined: none).
  std::pair<at::Tensor, at::Tensor> as_taken(at::Tensor grad, const at::Tensor& scale,
                                             const Side& s) const;

  const FlatLayout& layout_;
  int64_t host_begin_;
  at::Tensor whole_;    // the fp32 master when it is one tensor (undefined: two devices)
  at::Tensor primary_;  // the given optimizer's part: all, or the host tail
  at::Tensor device_;   // partial offload: the device head (a view of whole_ on the CPU)
  at::Tensor grads_;    // grad_dtype, layout.partition elements
  std::unique_ptr<optim::Optimizer> optimizer_;   // over primary_
  std::unique_ptr<optim::Optimizer> device_opt_;  // partial offload: over device_
  bool scaled_in_place_ = false;
  bool grads_on_host_ = false, pin_grads_ = false;
  bool offloaded_ = false;             // the master (its host share) off the device
  std::unique_ptr<NvmeSwapper> swap_;  // NVMe offload: where primary_'s values are  // this step's
                                       // apply_scale multiplied the partition
};

}  // namespace dscpp::zero
