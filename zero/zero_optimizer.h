// ZeRO stages 0-3 over the trainable parameters, composed of its three parts
// (docs/architecture.md, "ZeRO: one mechanism, in parts"): the parameter store
// (ParamStore: the flat buffer of stages 0-2, stage 3's gather / release /
// persistence, the one publish routine), the gradient buckets (GradBuckets),
// and the master partition (MasterPartition: this rank's fp32 copy and the
// optimizer state over it). step() computes the norm, the clip and the unscale
// once (step_scale.h), checks overflow across ranks, runs the optimizer on the
// partition, and publishes the new parameters. The methods below that only
// forward to a part keep the names the engine, checkpoints and tests call.
//
// Bucket order: the buckets should follow backward's order, so that each is complete, and its
// reduction issued, while backward still runs. The parameter store's first layout guesses
// reverse registration order. Everything else (the gradient buckets, the fp32 master, the
// optimizer state, offload's host and NVMe buffers) is made once, when the order is known: the
// first backward leaves its gradients in the parameters' .grad and records the order in which
// they became ready (rank 0's, broadcast); its end lays the buffers out in that order (the
// 16-bit flat buffer, the only one that exists yet, permuted in its own storage), builds the
// rest on that layout and reduces the first backward's gradients. Nothing is ever moved after
// it exists. A caller that needs a part before then (a checkpoint load before training) gets
// it built on the guess, which then stays. Not for layouts by layer (stage 3's units, or
// deferred all-gathers), whose order the layer list fixes, nor for stage 3, whose partition
// must exist before the first forward (the whole model may not fit on one rank): they keep
// their first layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/async_scalar_read.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/grad_buckets.h"
#include "dscpp/zero/master_partition.h"
#include "dscpp/zero/offload.h"
#include "dscpp/zero/offload_overlap.h"
#include "dscpp/zero/param_store.h"
#include "dscpp/zero/phase_times.h"

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
  // The gradient partition's type: fp32 (averaged gradients, accumulated in
  // fp32), or the 16-bit training type (the reduced sums as the collective left
  // them; half the memory, no rounding on top of the collective's; for no
  // accumulation or DeepSpeed's data_types.grad_accum_dtype in 16 bits).
  at::ScalarType grad_dtype = at::kFloat;
  // Whether gradients accumulate over several micro-steps (gradient_accumulation_steps > 1).
  // Without accumulation stages 0-1 need no flat gradient buffer beside the partition: each
  // bucket is reduced from its own storage, as at stage 2, and one rank's stage 0 writes
  // straight into the partition (a model's worth of 16-bit gradients less, and no add and
  // zeroing each step).
  bool accumulates = true;
  // Stages 0-1 with accumulation, where the reduction over the data group is the identity on
  // every element (one rank, the partition of the gradients' type on the device:
  // PartitionSink::may_alias): the gradient partition is the flat gradient buffer itself, so the
  // model's gradients are held once, not twice, and the boundary copies nothing into the
  // partition. false keeps two buffers (the same numbers; for tests and comparisons).
  bool alias_grad_partition = true;
  int64_t alignment = 8;  // elements; keeps every chunk 16-byte aligned in 16 bits
  // Parameter groups: each parameter's group (empty: one group) and each
  // group's optimizer settings over the optimizer's defaults (lr, weight_decay,
  // betas, ...).
  std::vector<int> group_of;
  std::vector<optim::Hyper> group_options;
  // Stage 3 by layer: each parameter's gathering unit (FlatLayout::build's
  // unit_of; -1: persistent). Empty: one unit, gathered as a whole.
  std::vector<int> unit_of;
  // Stages 1-2 with an elementwise optimizer (dscpp_deferred_allgather): the
  // step issues each bucket's all-gather and returns without waiting for it;
  // whoever reads the parameters next waits (wait_published: a layer's buckets
  // before its forward, or all of them), so the all-gathers overlap the next
  // forward instead of ending the step.
  bool defer_allgather = false;
  // A pipeline's stages: called with this rank's local sum of squares before the
  // data-parallel all-reduce, to add the other stages' (tied parameters counted once), so
  // that the norm, the clip and the overflow verdict are the whole model's. Empty: none.
  std::function<void(at::Tensor& local_sumsq)> reduce_sumsq_across;
  // How many ranks the reduced gradients are averaged over (ReduceOptions::average_over); 0:
  // the group's size. The engine's expert parameters: the data group's, over their expert-data
  // group.
  int average_over = 0;
  // Tensor parallelism under an optimizer that steps matrices whole (Muon): each parameter's
  // split over model_group (its partition_dim, -1: whole here; and its partition_stride, as
  // nn/tensor_parallel_attr.h defines them). A split matrix is gathered whole over the group
  // for its step (Optimizer::ShardParam::whole_of). Empty: every parameter is whole.
  struct ModelSplit {
    int64_t dim = -1;
    int64_t stride = 1;
  };
  std::vector<ModelSplit> model_split_of;
  std::shared_ptr<comm::ProcessGroup> model_group;
  // ZeRO-Offload of the optimizer (stages 1-3): the master and the optimizer state on the
  // host, stepped there by the CPU optimizer (zero/offload.h). The optimizer should have its
  // CPU kernels on (Optimizer::set_cpu_kernels).
  OffloadOptions offload;
  // ZeRO-Offload of the parameters (stage 3 only): the 16-bit partition on the host, brought
  // up a bucket at a time for its all-gather (zero/param_store.h).
  ParamOffloadOptions offload_param;
};

struct StepResult {
  bool applied = false;  // false: an overflow skipped it
  // Global norm of the unscaled gradients, before clipping: a 0-dim float64
  // tensor, on the training device so that the step itself never waits for the
  // device (read it when needed), or on the host when the overflow check has
  // already brought the sum there.
  at::Tensor grad_norm;
  // The global sum of squares the step was decided on (the one step() was given, or the one
  // it worked out), for optimizers that share its norm, clip and overflow verdict.
  at::Tensor global_sumsq;
};

class ZeroOptimizer {
 public:
  using BucketState = ParamStore::BucketState;

  // params: the trainable parameters in registration order, already in the
  // training dtype and on the training device; they become views of the flat
  // buffer.
  ZeroOptimizer(std::vector<at::Tensor> params, std::unique_ptr<optim::Optimizer> optimizer,
                std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options);
  ~ZeroOptimizer();

  // Around each backward: whether this micro-step's gradients are reduced now.
  void begin_backward(bool reduce);
  // Before the backward that ends an accumulation window, with the loss scale the step will
  // be given: with offload at stages 1-2, overlap_comm, no clipping and no overflow check, that
  // backward's buckets are updated on the host as they are reduced (zero/offload_overlap.h),
  // and step() only publishes them (not the first backward's, whose end lays the buffers out). With
  // a host gradient partition, that backward's landings also sum their chunks' squares, so that the
  // step's global_sumsq() makes no pass over the partition (GradBuckets::landed_sumsq).
  void arm_overlapped_step(double loss_scale);
  // Since construction: the overlapped steps, and their bucket updates that began before
  // backward ended (the overlap's evidence).
  int64_t overlapped_steps() const { return overlap_ ? overlap_->steps() : 0; }
  int64_t offload_updates_during_backward() const {
    return overlap_ ? overlap_->started_during_backward() : 0;
  }
  void end_backward();
  // Stage 3 by layer: backward has left every layer above `layer` (GradBuckets::
  // units_complete_above): their parameters count as ready, with or without gradients.
  void layers_done_above(int layer) { built().buckets_->units_complete_above(layer); }
  // At the accumulation boundary. loss_scale: what the loss was multiplied by.
  StepResult step(double loss_scale) { return step(loss_scale, at::Tensor()); }
  // The same with the global sum of squares given (undefined: global_sumsq()), where several
  // optimizers share one norm, clip and overflow verdict (the engine's dense and expert
  // parameters): each is stepped with the whole model's sum, in the same units (the same
  // deferred_scale()).
  StepResult step(double loss_scale, at::Tensor global_sumsq);
  // The global sum of squares of the gradient partition as it is (scaled, and sums where
  // deferred_scale() != 1): this rank's, reduce_sumsq_across's additions, summed over the
  // group at stages 1-3. A 0-dim fp32 tensor on the training device. Collective.
  at::Tensor global_sumsq();
  // What the partition's values are still to be multiplied by to be averaged gradients.
  double deferred_scale() { return built().buckets_->sink().deferred_scale(); }

  // The three parts.
  ParamStore& param_store() { return *store_; }
  GradBuckets& grad_buckets() { return *built().buckets_; }
  // Of the buckets the last backward reduced, how many were issued while gradients were still
  // to come: the reductions that can overlap backward (the layout's measure; none for the
  // first backward, whose gradients are reduced at its end).
  int buckets_issued_during_backward() const { return last_issued_early_; }
  MasterPartition& master() { return *built().master_; }
  // Whether the layout is final and every part exists (see the header).
  bool is_built() const { return master_ != nullptr; }
  // The order the parts were laid out in: the first backward's ready order, or the one given
  // to build_in_order (empty: the guess). A checkpoint records it, so that a run resumed from it
  // before its first backward is laid out as the run that saved it.
  const std::vector<int>& layout_order() const { return layout_order_; }
  // Builds the parts now, laid out in `order` (every parameter index once), unless they exist.
  void build_in_order(const std::vector<int>& order);

  const FlatLayout& layout() const { return layout_; }
  // Before the parts exist: the optimizer without its shards (its defaults; Optimizer::set_lr
  // reaches the shards made later).
  optim::Optimizer& optimizer() { return master_ ? master_->optimizer() : *pending_optimizer_; }
  // The parameter groups (one without ZeroOptions::group_of) and each one's lr, whether or not
  // the optimizer's shards exist yet.
  int num_groups() const {
    return std::max<int>(1, static_cast<int>(options_.group_options.size()));
  }
  double group_lr(int g) {
    if (master_) return master_->optimizer().get_lr(g);
    return pending_optimizer_->lr_for(
        options_.group_options.empty() ? optim::Hyper::object() : options_.group_options.at(g));
  }
  // fp32, layout().partition: the tensor itself, or with partial offload on a GPU (two
  // devices) a host copy that set_master_partition() writes back.
  at::Tensor master_partition() { return built().master_->whole(); }
  void set_master_partition(const at::Tensor& values) { built().master_->assign(values); }
  // options.grad_dtype; with the alias, the flat gradient buffer itself (grads_aliased()).
  const at::Tensor& grad_partition() { return built().master_->grads(); }
  bool grads_aliased() { return built().buckets_->sink().aliases_flat(); }
  at::Tensor& flat_params() { return store_->flat_params(); }  // stages 0-2
  // With defer_allgather: waits for bucket b's all-gather after the last step,
  // if it is still pending (on a GPU the current stream waits; the host does
  // not), or for every bucket's. No-ops otherwise. Every method here that reads
  // the parameters waits for all first.
  void wait_published(int bucket) { store_->wait_published(bucket); }
  void wait_all_published() { store_->wait_all_published(); }
  bool publish_pending() const { return store_->publish_pending(); }
  // Copies the master partition into the 16-bit parameters on every rank (after
  // a step or a checkpoint load). Collective at stages 1 and 2.
  void publish_master() { store_->publish(built().master_->whole()); }
  // The other way: the master partition from the (16-bit) parameters, as at
  // construction.
  void refresh_master_from_params() {
    at::Tensor m = built().master_->whole();
    store_->copy_partition_into(m);
    master_->assign(m);
  }
  // Which chunk of every bucket this rank owns: its rank at stages 1-3, 0 at
  // stage 0 (where the layout has one partition, the whole buffer).
  int layout_rank() const { return store_->chunk_rank(); }

  // Stage 3: the parameters hold empty tensors at rest, and are gathered a
  // bucket at a time (a bucket's chunks are all-gathered into a buffer of its
  // own, and the bucket's parameters become views of it). gather() / release():
  // every bucket; gathered(): all are. Collective (gather); no-ops at stages
  // 0-2 and when already in that state.
  void gather() { store_->gather(); }
  void release() { store_->release(); }  // leaves persistent buckets gathered
  bool gathered() const { return store_->gathered(); }
  // One bucket: start_gather issues its all-gather (asynchronously where the
  // backend allows), finish_gather waits for it and points the bucket's
  // parameters at the result (it starts the gather itself when none is in
  // flight). Every rank must gather the same buckets in the same order.
  void start_gather(int bucket) { store_->start_gather(bucket); }
  void finish_gather(int bucket) { store_->finish_gather(bucket); }
  void release_bucket(int bucket) { store_->release_bucket(bucket); }
  BucketState bucket_state(int bucket) const { return store_->bucket_state(bucket); }
  // A persistent bucket is gathered now and stays so (DeepSpeed's
  // stage3_param_persistence_threshold): release() leaves it, and steps refresh
  // it.
  void make_persistent(int bucket) { store_->make_persistent(bucket); }
  bool persistent(int bucket) const { return store_->persistent(bucket); }
  // Parameter NVMe offload (zero/param_swap.h): a bucket's read from its file issued ahead of
  // its gather where a swap buffer is free (false: none is), and whether its gather could
  // start without finishing another first. Without NVMe: true, nothing to read.
  bool read_ahead(int bucket) { return store_->read_ahead(bucket); }
  bool can_gather_now(int bucket) const { return store_->can_gather_now(bucket); }
  bool swaps_params() { return store_->swapper() != nullptr; }
  // Elements of 16-bit parameter buffers gathered or in flight now, and their
  // peak since construction, persistent buckets left out (DeepSpeed's live
  // parameters).
  int64_t live_numel() const { return store_->live_numel(); }
  int64_t peak_live_numel() const { return store_->peak_live_numel(); }
  // While gathered: every rank takes rank src's parameter values into its
  // partition (16-bit and fp32 master), so a change made on one rank reaches
  // all. Collective.
  void scatter_gathered_from(int src_rank) {
    at::Tensor m = built().master_->whole();
    store_->scatter_gathered_from(src_rank, m);
    master_->assign(m);
  }
  // Elements the module's parameters hold now (all of them at stages 0-2; at
  // rest at stage 3 only the persistent ones), and of this rank's 16-bit
  // partition (stage 3), for the 1/N memory assertions.
  int64_t params_numel_held() const { return store_->params_numel_held(); }
  int64_t partition16_numel() const { return store_->partition16_numel(); }
  int64_t gathers() const { return store_->gathers(); }  // how many bucket gathers ran
  const std::vector<at::Tensor>& params() const { return store_->params(); }
  // An optimizer state (or the step count) over the whole partition, whatever
  // the number of groups (one optimizer shard each): what checkpoints save and
  // load.
  at::Tensor state_partition(const std::string& name) {
    return built().master_->state_partition(name);
  }
  void load_state_partition(const std::string& name, const at::Tensor& values) {
    built().master_->load_state_partition(name, values);
  }
  std::vector<std::string> state_names() { return built().master_->state_names(); }
  int64_t step_count() { return built().master_->step_count(); }
  void set_step_count(int64_t steps) { built().master_->set_step_count(steps); }
  // Parameter i's shape (a stage-3 parameter at rest holds an empty tensor).
  const std::vector<int64_t>& param_shape(size_t i) const { return store_->param_shape(i); }
  int stage() const { return options_.stage; }
  bool offloaded() const { return options_.offload.enabled; }
  // Every buffer the three parts hold now, by name (zero/memory_breakdown.h): params16.*,
  // grads16.flat, reduce_buckets, grad_partition, fp32_master, optimizer.<state>,
  // offload.staging. An aliased partition (ZeroOptions::alias_grad_partition) is listed once,
  // as grad_partition, with no grads16.flat beside it. The reduce buckets' peak since construction:
  // reduce_buckets_peak().
  MemoryBreakdown memory_breakdown() const;
  int64_t reduce_buckets_peak() const { return buckets_ ? buckets_->peak_in_flight_bytes() : 0; }
  // Host time of the step's phases since the last call, by name (phase_times.h; for
  // wall_clock_breakdown): step.sumsq (the global sum of squares), the landings' (landing.*,
  // with a host gradient partition), the offloaded step's (offload.*) and the overlapped
  // one's (overlap.*).
  PhaseTimes take_phase_times();

 private:
  // Stages 1-2 with an elementwise optimizer: the update and the publish,
  // bucket by bucket.
  void step_by_bucket(const at::Tensor& scale);
  // With offload and an elementwise optimizer, stages 1-3: the same bucket by bucket, the
  // update on the host (OffloadStepper).
  void step_offloaded(const at::Tensor& scale);
  // The step of an overlapped backward: wait for each bucket's update, publish it.
  void step_overlapped();
  // After a step (or an overflow's skip): the partition counts as empty again.
  void clear_gradients();
  // The parts on the final layout (`order`: the first backward's ready order; empty: the
  // guess), once. built(): this, with them built on the guess if they are not yet.
  void build(const std::vector<int>& order);
  ZeroOptimizer& built() {
    if (!master_) build({});
    return *this;
  }
  // The end of the first backward: the layout from its ready order, the parts, and its
  // gradients (in the parameters' .grad) reduced.
  void take_first_backward();
  // The layout for this optimizer (flat ranges, or every parameter whole in one rank's
  // partition where the optimizer needs_whole_params), in `ready_order` (empty: the guess).
  FlatLayout lay_out(const std::vector<int>& ready_order) const;
  // For an optimizer that needs_whole_params: each shard's parameters (this rank's own).
  void describe_shards();

  ZeroOptions options_;
  std::shared_ptr<comm::ProcessGroup> group_;
  FlatLayout layout_;
  std::vector<std::vector<int64_t>> shapes_;  // the parameters' shapes, in registration order
  bool whole_params_ = false;                 // the optimizer needs_whole_params
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<MasterPartition> master_;
  std::unique_ptr<GradBuckets> buckets_;
  std::unique_ptr<OffloadStepper> offload_;  // with options.offload.enabled
  std::unique_ptr<OffloadOverlap> overlap_;  // where the update can overlap backward
  bool armed_ = false;
  bool window_end_ = false;  // arm_overlapped_step: the next backward ends the window
  double armed_loss_scale_ = 1.0;
  std::vector<at::Tensor> overlap_destinations_;  // per bucket, during an overlapped step
  std::shared_ptr<void> hooks_;
  std::shared_ptr<void>
      destinations_;  // the products' gradient destinations (ops/grad_destination.h)
  ReduceOptions reduce_options_;
  at::TensorOptions param_options_;
  std::unique_ptr<optim::Optimizer> pending_optimizer_;  // until build() gives it to the master
  // Until built: the first backward's ready order, and whether it reduces.
  std::vector<int> first_order_;
  std::vector<char> first_seen_;
  // ZeRO-Offload with the gradient partition on the host: the first backward's gradients, each
  // moved there as it is ready (the device then holds no more of them than a backward with
  // buckets does: the re-lay's peak, perf-log 2026-12-07 Y); empty otherwise.
  std::vector<at::Tensor> first_parked_;
  std::vector<int> layout_order_;
  bool first_reduce_ = false;
  int last_issued_early_ = 0;
  AsyncScalarRead verdict_;  // the global sum of squares, when the device decides overflow
  double sumsq_ms_ = 0;      // step(): the global sum of squares (phase_times.h)
};

}  // namespace dscpp::zero
