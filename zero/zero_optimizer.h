// ZeRO stages 0-3 over the trainable parameters: where the 16-bit (or fp32) parameters live
// (stages 0-2: one flat buffer whose views are the module's parameters; stage 3: this
// rank's chunks, gathered a bucket at a time), the bucketed gradient reduction
// (GradBuckets), and this rank's fp32 master partition with its optimizer state (one shard
// per parameter group). step() unscales, checks overflow across ranks, clips by the
// global norm, runs the optimizer on the partition, and all-gathers the new parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/async_scalar_read.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/grad_buckets.h"

namespace dscpp::zero {

struct ZeroOptions {
  int stage = 0;
  int64_t reduce_bucket_size = 500000000;
  bool overlap_comm = false;
  bool reduce_scatter = true;  // stages 1-2: false all-reduces and keeps this rank's chunk
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<at::ScalarType> communication_data_type;
  double gradient_clipping = 0.0;  // 0: no clipping
  bool check_overflow = false;     // fp16 (and bf16 with check_grad_overflow)
  // The gradient partition's type: fp32 (averaged gradients, accumulated in fp32), or the
  // 16-bit training type (the reduced sums as the collective left them; half the memory,
  // no rounding on top of the collective's; for no accumulation or DeepSpeed's
  // data_types.grad_accum_dtype in 16 bits).
  at::ScalarType grad_dtype = at::kFloat;
  int64_t alignment = 8;  // elements; keeps every chunk 16-byte aligned in 16 bits
  // Parameter groups: each parameter's group (empty: one group) and each group's optimizer
  // settings over the optimizer's defaults (lr, weight_decay, betas, ...).
  std::vector<int> group_of;
  std::vector<optim::Hyper> group_options;
  // Stage 3 by layer: each parameter's gathering unit (FlatLayout::build's unit_of; -1:
  // persistent). Empty: one unit, gathered as a whole.
  std::vector<int> unit_of;
  // Stages 1-2 with an elementwise optimizer (dscpp_deferred_allgather): the step issues each
  // bucket's all-gather and returns without waiting for it; whoever reads the parameters
  // next waits (wait_published: a layer's buckets before its forward, or all of them), so
  // the all-gathers overlap the next forward instead of ending the step.
  bool defer_allgather = false;
};

struct StepResult {
  bool applied = false;  // false: an overflow skipped it
  // Global norm of the unscaled gradients, before clipping: a 0-dim float64 tensor, on the
  // training device so that the step itself never waits for the device (read it when
  // needed), or on the host when the overflow check has already brought the sum there.
  at::Tensor grad_norm;
};

class ZeroOptimizer {
 public:
  // params: the trainable parameters in registration order, already in the training dtype
  // and on the training device; they become views of the flat buffer.
  ZeroOptimizer(std::vector<at::Tensor> params, std::unique_ptr<optim::Optimizer> optimizer,
                std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options);
  ~ZeroOptimizer();

  // Around each backward: whether this micro-step's gradients are reduced now.
  void begin_backward(bool reduce);
  void end_backward();
  // At the accumulation boundary. loss_scale: what the loss was multiplied by.
  StepResult step(double loss_scale);

  const FlatLayout& layout() const { return layout_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  at::Tensor& master_partition() { return master_; }  // fp32, layout().partition elements
  const at::Tensor& grad_partition() const { return grad_partition_; }  // ZeroOptions::grad_dtype
  at::Tensor& flat_params() {                                           // stages 0-2
    wait_all_published();
    return flat_params_;
  }
  // With defer_allgather: waits for bucket b's all-gather after the last step, if it is still
  // pending (on a GPU the current stream waits; the host does not), or for every bucket's.
  // No-ops otherwise. Every method here that reads the parameters waits for all first.
  void wait_published(int bucket);
  void wait_all_published();
  bool publish_pending() const { return pending_publishes_ > 0; }
  // Copies the master partition into the 16-bit parameters on every rank (after a step or
  // a checkpoint load). Collective at stages 1 and 2.
  void publish_master();
  // The other way: the master partition from the (16-bit) parameters, as at construction.
  void refresh_master_from_params();
  // Which chunk of every bucket this rank owns: its rank at stages 1-2, 0 at stage 0 (where
  // the layout has one partition, the whole buffer).
  int layout_rank() const;

  // Stage 3: the parameters hold empty tensors at rest, and are gathered a bucket at a time
  // (a bucket's chunks are all-gathered into a buffer of its own, and the bucket's
  // parameters become views of it). gather() / release(): every bucket; gathered(): all are.
  // Collective (gather); no-ops at stages 0-2 and when already in that state.
  void gather();
  void release();  // leaves persistent buckets gathered
  bool gathered() const;
  // One bucket: start_gather issues its all-gather (asynchronously where the backend allows),
  // finish_gather waits for it and points the bucket's parameters at the result (it starts
  // the gather itself when none is in flight). Every rank must gather the same buckets in
  // the same order.
  void start_gather(int bucket);
  void finish_gather(int bucket);
  void release_bucket(int bucket);
  enum class BucketState { kRest, kInFlight, kGathered };
  BucketState bucket_state(int bucket) const;
  // A persistent bucket is gathered now and stays so (DeepSpeed's
  // stage3_param_persistence_threshold): release() leaves it, and steps refresh it.
  void make_persistent(int bucket);
  bool persistent(int bucket) const;
  // Elements of 16-bit parameter buffers gathered or in flight now, and their peak since
  // construction, persistent buckets left out (DeepSpeed's live parameters).
  int64_t live_numel() const { return live_; }
  int64_t peak_live_numel() const { return peak_live_; }
  // While gathered: every rank takes rank src's parameter values into its partition (16-bit
  // and fp32 master), so a change made on one rank reaches all. Collective.
  void scatter_gathered_from(int src_rank);
  // Elements the module's parameters hold now (all of them at stages 0-2; at rest at stage 3
  // only the persistent ones), and of this rank's 16-bit partition (stage 3), for the 1/N
  // memory assertions.
  int64_t params_numel_held() const;
  int64_t partition16_numel() const { return part16_.defined() ? part16_.numel() : 0; }
  int64_t gathers() const { return gathers_; }  // how many bucket gathers ran
  const std::vector<at::Tensor>& params() const { return params_; }
  // An optimizer state (or the step count) over the whole partition, whatever the number of
  // groups (one optimizer shard each): what checkpoints save and load.
  at::Tensor state_partition(const std::string& name);
  void load_state_partition(const std::string& name, const at::Tensor& values);
  std::vector<std::string> state_names();
  int64_t step_count() { return optimizer_->step_count(0); }
  void set_step_count(int64_t steps);
  // Parameter i's shape (a stage-3 parameter at rest holds an empty tensor).
  const std::vector<int64_t>& param_shape(size_t i) const { return param_shapes_.at(i); }
  int stage() const { return options_.stage; }

 private:
  // Stages 1-2 with an elementwise optimizer: the update and the all-gather, bucket by bucket.
  void step_by_bucket(const at::Tensor& grad_scale);
  // Fills `whole` (a bucket) with every rank's `mine` (its chunk): an all-gather, or a copy on
  // one rank (an empty Work then).
  comm::Work gather_chunks(at::Tensor whole, const at::Tensor& mine);
  bool in_place_gather() const;  // whether a chunk is updated in its place in the bucket
  // Stages 1-2: bucket i's updated chunk, cast to the parameters' type, into every rank's
  // flat parameter buffer.
  comm::Work publish_bucket(int i);

  ZeroOptions options_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grad_views_;  // params_[i].grad() must stay this view
  FlatLayout layout_;
  at::Tensor flat_params_, flat_grads_;
  // After a step (or an overflow's skip): the partition counts as empty again.
  void clear_gradients();
  // The gradient of partition elements [begin, end) as the optimizer takes it (see step()).
  at::Tensor update_grad(int64_t begin, int64_t end, const at::Tensor& grad_scale);

  at::Tensor master_;          // fp32, this rank's partition
  at::Tensor grad_partition_;  // options_.grad_dtype, as master_
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<GradBuckets> buckets_;
  std::shared_ptr<void> hooks_;
  std::vector<std::vector<int64_t>> param_shapes_;
  at::Tensor part16_;  // stage 3: this rank's 16-bit chunks, laid out as master_
  struct Gathered {    // stage 3, per bucket
    BucketState state = BucketState::kRest;
    bool persistent = false;
    at::Tensor buffer;  // the whole bucket while in flight or gathered
    comm::Work work;
  };
  std::vector<Gathered> buckets16_;
  int64_t live_ = 0, peak_live_ = 0;
  int64_t gathers_ = 0;
  AsyncScalarRead verdict_;  // the global sum of squares, when the device decides overflow
  std::vector<comm::Work> published_;  // per bucket: its deferred all-gather, until waited for
  int pending_publishes_ = 0;
};

}  // namespace dscpp::zero
