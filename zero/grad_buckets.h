// The gradient reduction of ZeRO stages 0-2, one mechanism for all: as backward fills the
// flat gradient buffer, each bucket whose parameters are all ready is reduced, strictly in
// bucket order on every rank (so every rank issues the same collectives in the same
// order). Stage 0 all-reduces a bucket; stages 1-3 reduce-scatter it, each rank keeping
// its chunk. finish() waits for the reductions and adds the results into the gradient
// partition, then zeroes the reduced 16-bit buckets for the next accumulation.
//
// The partition's type decides how: an fp32 partition receives averaged gradients (each
// result widened, then scaled by 1/world). A 16-bit partition (the training type, with no
// accumulation in fp32: see ZeroOptions::grad_dtype) receives the reduced sums themselves,
// with no rounding on top of the collective's: a reduce-scatter writes straight into it, and
// the averaging is left to the step (deferred_scale()), which folds it into its unscale.
//
// Where the 16-bit gradients live: stages 0 and 1 accumulate over micro-steps in one flat
// buffer (the parameters' .grad are views of it). Stages 2 and 3 reduce every micro-step, so
// no whole buffer is kept: a bucket's storage is made when its first gradient arrives, each
// gradient is copied in and the parameter's .grad dropped, and the storage goes as soon as
// its collective is issued. Only buckets in flight hold 16-bit gradients.
// Gradient accumulation fusion (ops/grad_destination.h): slot() gives a linear's weight-gradient
// product its place in the buffer (the flat view, or the bucket's storage), so that the
// gradient arrives in place and mark_ready copies nothing (copies() counts what it did copy).
// With one rank in the group a reduction is the identity: none is issued, and where it would
// write the partition directly (a fresh 16-bit one), the bucket's storage is that partition's
// slice itself. In flat mode the partition may even be the flat buffer itself (the alias: the
// caller passes the same tensor to both, where may_alias_partition() says the identity is exact):
// then no second copy of the gradients exists, the reduction moves nothing, finish() leaves the
// buffer as it is (it is what the step reads), and the step's zeroing of the partition
// (overwrites_partition() is false) starts the next window.
// With overlap_comm the collectives run while backward goes on (on CUDA, on NCCL's own
// stream behind an event); without it each one is waited for as it is issued.
//
// Parameters without a gradient count as zero gradients (DeepSpeed's behaviour), and which
// parameters got one may differ between ranks (an expert that received no tokens on one rank
// of its expert-data group, a branch the data skips): a rank then issues a bucket during
// backward that a peer issues only at finish(). Two rules keep that from hanging or
// mis-pairing a collective:
//   - During backward no host waits for a bucket's reduction: where Work::wait() holds the
//     thread (Gloo) a reduction is completed there only once it has completed, the rest at
//     finish(); on NCCL a wait only orders the compute stream. Otherwise a rank held in such a
//     wait could never issue a collective of another group (the model's all-to-all, the dense
//     buckets) that the late peer needs before it reaches finish().
//   - Where other collectives share the group during backward (stage 3's layer gathers), a
//     bucket is issued at a point every rank reaches alike: units_complete_above() marks a
//     layer's parameters ready when backward has left it, with or without their gradients.
//   A hook that fires for a parameter already counted (twice in one backward) is not counted
//   again, so a bucket never starts before its parameters are in.
// What stays: on NCCL a host synchronisation inside backward (a recomputed forward that reads
// counts on the host, offload's landing of a chunk) may wait behind a stream-ordered bucket
// that a peer issues at finish().
//
// A partition in host memory (ZeRO-Offload, MasterPartition::grads_on_host): each reduced chunk
// leaves the device as soon as its reduction is complete, on a copy stream into page-locked
// memory (straight into the partition when the sums overwrite it, else into a staging chunk
// that the host then adds in), so no gradient partition is kept on the device; the waiting and
// the adding are a worker's (zero/host_landing.h), not the backward's thread. A bucket counts
// as complete (on_complete, then called on that worker) once its chunk is in the host
// partition. A CPU run takes the same steps with plain copies.
#pragma once

#include <ATen/core/Tensor.h>
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/host_landing.h"
#include "dscpp/zero/memory_breakdown.h"
#include "dscpp/zero/phase_times.h"

namespace dscpp::zero {

struct ReduceOptions {
  bool scatter = false;  // keep only this rank's chunk (stages 1, 2) instead of the whole bucket
  // With scatter: one reduce-scatter per bucket (DeepSpeed's reduce_scatter: true), or an
  // all-reduce of which each rank keeps its chunk (false: more traffic, DeepSpeed's choice
  // for reductions the scatter cannot do).
  bool use_reduce_scatter = true;
  bool overlap_comm = false;  // keep collectives in flight (two at a time) while backward runs
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<at::ScalarType> communication_data_type;  // unset: the gradients' type
  // How many ranks' gradients the reduced sum is averaged over; 0: the group's size. Experts'
  // gradients are summed over the expert-data group and averaged over the whole data group
  // (DeepSpeed's _reduce_expert_gradients and its ZeRO 1-2: "to maintain the gradients value
  // unaffected by ep_size"), since each expert's gradient already sums its expert-parallel
  // group's tokens.
  int average_over = 0;
};

class GradBuckets {
 public:
  // flat_grads: the whole buffer (stages 0-1), whose views become the parameters' .grad, or
  // undefined for per-bucket storage (stages 2-3), where params are read for their .grad
  // (dropped here) and grad_options give the storage's type. flat_grads_zero: the caller knows
  // the buffer holds only zeros (fresh, or zeroed by a finished reduction), so the first product
  // into each view may overwrite it; false: it may hold gradients (a re-lay carried them over).
  GradBuckets(const FlatLayout& layout, at::Tensor flat_grads, std::vector<at::Tensor> params,
              at::TensorOptions grad_options, std::shared_ptr<comm::ProcessGroup> group,
              ReduceOptions options, bool flat_grads_zero = false);
  ~GradBuckets();

  // Starts a backward; when `reduce` is false (a micro-step inside an accumulation window
  // of stages 0 and 1) gradients just accumulate in the flat buffer. Points every .grad back
  // at its view first (or, per bucket, drops it), whatever the module did to it since.
  void begin(bool reduce);
  // Parameter i's gradient is complete for this backward.
  void mark_ready(int param);
  // Backward has left every layer above `unit` (stage 3 by layer: FlatLayout's units): the
  // parameters of units above it that autograd gave no gradient count as ready (zeros), so
  // their buckets go at the same point on every rank (see above). Persistent ones (-1) wait
  // for finish().
  void units_complete_above(int unit);
  // Where a product may write parameter i's gradient this backward (shaped as the parameter),
  // and whether it must add to what is there; written(i) once it has. Undefined: nowhere.
  at::Tensor slot(int param, bool& accumulate);
  void written(int param);
  // Gradients mark_ready copied (or added) from .grad into bucket storage, since construction.
  int64_t copies() const { return copies_; }
  void count_copies(int64_t n) { copies_ += n; }  // (a re-lay's new buckets carry the count on)
  // Where finish() adds: layout.partition elements (the whole buffer at stage 0), fp32 or
  // the 16-bit type. The partition counts as empty until finish(); after the step zeroes
  // it, cleared() says so again (a reduction may then overwrite it instead of adding).
  // fresh: whether it holds nothing yet (false: a re-lay carried reduced gradients over).
  // on_host: the partition is in host memory (see above), whatever the device of a CPU run.
  // A partition that is the flat buffer itself (same storage and size: the alias) must be
  // one may_alias_partition() allows: a dscpp::Error otherwise.
  void set_partition(at::Tensor partition, bool fresh = true, bool on_host = false);
  void cleared();
  // Whether a gradient partition of type partition_type (on the host: on_host) may be the flat
  // gradient buffer itself, the gradients being of type grad_type and reduced over group_size
  // ranks with `options`: the reduction is then the identity on every element and the
  // partition's values are the flat buffer's bit for bit. One rank; the same type; on the
  // device; no conversion for the communication; no scaling before the sum (prescale,
  // predivide); and nothing after it that an fp32 partition would have to apply itself (a
  // 16-bit one defers the averaging to the step).
  static bool may_alias_partition(const ReduceOptions& options, int group_size,
                                  at::ScalarType grad_type, at::ScalarType partition_type,
                                  bool on_host);
  // The partition is the flat buffer (set_partition).
  bool aliases_partition() const { return aliased_; }
  bool fresh() const { return fresh_; }
  const at::Tensor& flat_grads() const { return flat_grads_; }  // stages 0-1
  // Whether the flat buffer holds only zeros (no gradient written since it was last zeroed).
  bool flat_grads_zero() const;
  // Whether the next reduction writes every element of the partition rather than adding to
  // it (a 16-bit partition filled by reduce-scatters), so that it need not be zeroed first.
  // Never for the alias: the flat buffer accumulates into what it holds.
  bool overwrites_partition() const;
  // Reduces what backward left (unused parameters), waits, and adds the results into the
  // partition.
  void finish();
  // A host partition: the next reducing backward is the last of its accumulation window, so
  // each chunk is final once it has landed, and the landing also sums its squares (on the
  // landing's worker, while backward goes on). landed_sumsq(): the partition's sum of squares
  // from those sums (added in bucket order) after that backward's finish(), until the partition
  // changes (the next begin(), cleared()); unset otherwise (no host partition, not asked for,
  // or a landing failed). The same value as ops::sum_of_squares of the partition, up to the
  // order of the double additions.
  void sum_squares_on_landing() { sum_next_ = host_; }
  std::optional<double> landed_sumsq() const;
  // Called with b once bucket b's reduction is in the partition (in bucket order; on a GPU in
  // the current stream's order; a host partition: on the landing's worker, once the chunk is
  // there): the offloaded update may start on it (zero/offload_overlap.h). Empty: none. Set it
  // between backwards.
  void set_on_complete(std::function<void(int)> fn);
  // Host time of the landings since the last call (host_landing.h's phases; none without a host
  // partition).
  void take_phase_times(PhaseTimes& times);
  // What the partition's values are still to be multiplied by to be averaged gradients: 1 for
  // an fp32 partition, 1/world (DeepSpeed's post-division; world: average_over) for a 16-bit
  // one.
  double deferred_scale() const;
  // The parameters in the order their gradients were first seen ready, since construction
  // (reduced or not); parameters never seen come last, in reverse registration order.
  std::vector<int> ready_order() const;
  // Of the buckets the last finished backward reduced, how many were issued while gradients
  // were still to come (the reductions that overlap backward, with overlap_comm).
  int issued_during_backward() const { return issued_early_; }
  // The buffers held now (grads16.flat, unless it is the partition, which its owner lists;
  // the buckets in flight: reduce_buckets), and the most
  // bytes the buckets in flight held at once since construction (on the device).
  void add_memory(MemoryBreakdown& m) const;
  int64_t peak_in_flight_bytes() const { return peak_in_flight_; }

 private:
  void launch_ready();
  void launch(int bucket);
  // Whether this thread may wait for a reduction now: not during backward where the wait
  // holds the host (see above).
  bool may_wait() const { return !in_backward_ || !wait_blocks_host_; }
  // After bucket `launched` was issued: completes the older reductions, in bucket order, that
  // may be completed now (beyond the kInFlight window, or, where waiting is not allowed, those
  // already done).
  void complete_older(int launched);
  void complete(int bucket);  // waits for its reduction and adds it into the partition
  // A host partition: bucket b's reduced chunk `source` starts down to its place (HostLanding).
  void start_landing(int b, const at::Tensor& source);
  int64_t in_flight_bytes() const;
  void note_in_flight() { peak_in_flight_ = std::max(peak_in_flight_, in_flight_bytes()); }
  bool per_bucket() const { return !flat_grads_.defined(); }
  bool raw() const { return partition_.scalar_type() != at::kFloat; }
  double post_scale() const;  // the averaging after the sum
  int averaged_over() const {
    return options_.average_over > 0 ? options_.average_over : group_->size();
  }
  at::Tensor target(int bucket);        // the bucket's share of the partition
  at::Tensor bucket_data(int bucket);   // per-bucket mode: complete, padding and unused zeroed
  at::Tensor& storage(int bucket);      // per-bucket mode: made on first use
  bool in_partition(int bucket) const;  // the bucket's storage is the partition's slice

  const FlatLayout& layout_;
  at::Tensor flat_grads_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grad_views_;  // flat mode: params_[i].grad() must stay this view
  at::TensorOptions grad_options_;
  std::vector<at::Tensor> storage_;  // per bucket (per-bucket mode): until its launch
  std::vector<char> written_;        // per parameter (per-bucket mode): copied in this backward
  std::vector<char> dirty_;          // per parameter (flat mode): its view may be nonzero
  int64_t copies_ = 0;
  std::shared_ptr<comm::ProcessGroup> group_;
  ReduceOptions options_;
  bool reducing_ = false;
  bool in_backward_ = false;  // between begin(true) and finish()'s own launches
  // Work::wait() holds this thread (Gloo), rather than ordering the current stream (NCCL).
  bool wait_blocks_host_ = true;
  std::vector<int> pending_;  // per bucket: parameters not yet ready
  std::vector<char> ready_;   // per parameter: counted ready this backward
  int next_launch_ = 0;       // buckets are issued in this order only
  int next_complete_ = 0;     // and completed in the same order
  static constexpr int kInFlight = 2;
  std::vector<comm::Work> works_;    // per bucket, this backward
  std::vector<at::Tensor> results_;  // per bucket: the reduced data (chunk or whole bucket)
  std::vector<char> direct_;         // per bucket: results_ is the partition's own slice
  at::Tensor partition_;
  bool aliased_ = false;  // partition_ is flat_grads_ (set_partition)
  bool fresh_ = true;
  std::vector<int> seen_order_;       // parameters, as first seen ready
  std::vector<char> seen_;            // per parameter: in seen_order_
  int ready_calls_ = 0;               // mark_ready calls this backward
  std::vector<int> ready_at_launch_;  // per bucket: ready_calls_ when it was issued
  int issued_early_ = 0;
  std::function<void(int)> on_complete_;
  bool host_ = false;                     // the partition is in host memory
  std::unique_ptr<HostLanding> landing_;  // with host_: the chunks' way down
  bool sum_next_ = false, summing_ = false, landed_valid_ = false;  // see sum_squares_on_landing
  std::vector<double> landed_sumsq_;                                // per bucket, while summing_
  int64_t peak_in_flight_ = 0;
};

}  // namespace dscpp::zero
