// The gradient reduction of ZeRO stages 0-2, one mechanism for all: as backward fills the
// flat gradient buffer, each bucket whose parameters are all ready is reduced, strictly in
// bucket order on every rank (so every rank issues the same collectives in the same
// order). Stage 0 all-reduces a bucket; stages 1-3 reduce-scatter it, each rank keeping
// its chunk. finish() waits for the reductions and adds the results into the gradient
// partition, then zeroes the reduced 16-bit buckets for the next accumulation.
//
// Where the results go is the gradient partition's sink (partition_sink.h), chosen once when
// the partition is given: a device partition (added in, or written by the collective itself),
// the flat buffer itself (the alias: nothing moves), or a host partition (ZeRO-Offload: each
// chunk lands through a worker, which may sum its squares). GradBuckets is the reducer:
// readiness, the strict order, the issuing, at most two reductions in flight.
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
// slice itself. In flat mode the partition may even be the flat buffer itself (the alias): then
// finish() leaves the buffer as it is (it is what the step reads).
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
#pragma once

#include <ATen/core/Tensor.h>
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/memory_breakdown.h"
#include "dscpp/zero/partition_sink.h"
#include "dscpp/zero/phase_times.h"
#include "dscpp/zero/reduce_options.h"

namespace dscpp::zero {

class GradBuckets {
 public:
  // flat_grads: the whole buffer (stages 0-1), whose views become the parameters' .grad, or
  // undefined for per-bucket storage (stages 2-3), where params are read for their .grad
  // (dropped here) and grad_options give the storage's type. The flat buffer holds zeros, so
  // the first product into each view may overwrite it.
  GradBuckets(const FlatLayout& layout, at::Tensor flat_grads, std::vector<at::Tensor> params,
              at::TensorOptions grad_options, std::shared_ptr<comm::ProcessGroup> group,
              ReduceOptions options);

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
  // Where finish() puts the results (PartitionSink::make's arguments). Until finish() the
  // partition counts as empty; after the step zeroes it, cleared() says so again (a reduction
  // may then overwrite it instead of adding).
  void set_partition(at::Tensor partition, bool on_host = false);
  void cleared();
  PartitionSink& sink() { return *sink_; }
  const PartitionSink& sink() const { return *sink_; }
  const at::Tensor& flat_grads() const { return flat_grads_; }  // stages 0-1
  // Reduces what backward left (unused parameters), waits, and adds the results into the
  // partition.
  void finish();
  // Called with b once bucket b's reduction is in the partition (in bucket order; on a GPU in
  // the current stream's order; a host partition: on the landing's worker, once the chunk is
  // there): the offloaded update may start on it (zero/offload_overlap.h). Empty: none. Set it
  // between backwards, after set_partition.
  void set_on_complete(std::function<void(int)> fn);
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
  int64_t in_flight_bytes() const;
  void note_in_flight() { peak_in_flight_ = std::max(peak_in_flight_, in_flight_bytes()); }
  bool per_bucket() const { return !flat_grads_.defined(); }
  int averaged_over() const {
    return options_.average_over > 0 ? options_.average_over : group_->size();
  }
  at::Tensor bucket_data(int bucket);  // per-bucket mode: complete, padding and unused zeroed
  at::Tensor& storage(int bucket);     // per-bucket mode: made on first use
  // The bucket's storage is the partition's slice.
  bool in_partition(int bucket) const { return sink_ && sink_->storage_in_partition(bucket); }

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
  std::unique_ptr<PartitionSink> sink_;
  int ready_calls_ = 0;               // mark_ready calls this backward
  std::vector<int> ready_at_launch_;  // per bucket: ready_calls_ when it was issued
  int issued_early_ = 0;
  std::function<void(int)> on_complete_;
  int64_t peak_in_flight_ = 0;
};

}  // namespace dscpp::zero
