// ZeRO's master partition (DESIGN.md, "Master partition"): this rank's fp32 copy of its
// chunks of every bucket, the gradient partition that GradBuckets reduce into, and the
// optimizer state over them (one optimizer shard per parameter group, each group's chunks
// contiguous in the partition). With offload (zero/offload.h) the master and the optimizer
// state live in host memory while the gradient partition stays on the device, and the update
// goes piece by piece from gradients brought down. The step's arithmetic on the partition
// lives here; where the results go is the parameter store's business.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/flat_layout.h"

namespace dscpp::zero {

class MasterPartition {
 public:
  // options: the training device (its dtype is ignored: the master is fp32). grad_dtype: the
  // gradient partition's type (fp32, or the 16-bit training type). on_host: the master (and so
  // the optimizer state) in host memory, the gradient partition on options' device (offload).
  // The layout must outlive it.
  MasterPartition(const FlatLayout& layout, at::TensorOptions options,
                  std::unique_ptr<optim::Optimizer> optimizer, at::ScalarType grad_dtype,
                  bool on_host = false);
  // One optimizer shard per parameter group (group_options[g] over the optimizer's
  // defaults). Separate from construction so that stage 3 can release its 16-bit model before
  // the optimizer state exists.
  void add_shards(const std::vector<optim::Hyper>& group_options);
  // After the layout changed (the re-lay after the first backward): relay(t) gives a tensor
  // laid out as the old partition laid out as the new one. The master, the gradient partition
  // and every optimizer state of the partition's size move; the shards follow.
  void relayout(const std::function<at::Tensor(const at::Tensor&)>& relay);

  at::Tensor& master() { return master_; }
  const at::Tensor& grads() const { return grads_; }
  at::Tensor& grads() { return grads_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

  // This rank's part of the global sum of squares: one pass over the gradient partition (a
  // 16-bit one widened as it is read, accumulated in fp32), no temporary of its size. 0-dim fp32.
  at::Tensor local_sumsq() const;
  // Multiplies an fp32 gradient partition by scale in place, unless the optimizer applies the
  // scale as it reads the gradient (a pass over the partition saved).
  void apply_scale(const at::Tensor& scale);
  // The whole update: every shard from its gradient.
  void update(const at::Tensor& scale);
  // Stages 1-2 with an elementwise optimizer, bucket by bucket: begin_bucket_updates() once,
  // then update_bucket(b) writes bucket b's updated chunk, cast, into copy16 too.
  void begin_bucket_updates() { optimizer_->begin_step(); }
  void update_bucket(int b, const at::Tensor& scale, const at::Tensor& copy16);
  // Offload: elements [offset, offset + grad.numel()) of bucket b's chunk from grad (a host
  // copy of that range of the gradient partition), the updated parameters into copy16.
  void update_piece(int b, int64_t offset, const at::Tensor& grad, const at::Tensor& scale,
                    const at::Tensor& copy16);
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
  // The gradient of partition elements [begin, end) as the optimizer takes it.
  at::Tensor update_grad(int64_t begin, int64_t end, const at::Tensor& scale);
  at::Tensor as_taken(at::Tensor grad, const at::Tensor& scale);

  const FlatLayout& layout_;
  at::Tensor master_;  // fp32, layout.partition elements
  at::Tensor grads_;   // grad_dtype, as master_
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace dscpp::zero
