// Where ZeRO's reduced gradients go (grad_buckets.h issues the reductions): the gradient
// partition, in one of three forms, chosen once when the partition is given (make):
//   - a device partition (a CPU run's memory too). An fp32 partition receives averaged
//     gradients (each result widened, then scaled by post_scale()); a 16-bit one (the training
//     type, with no accumulation in fp32: ZeroOptions::grad_dtype) the reduced sums themselves,
//     with no rounding on top of the collective's, the averaging left to the step
//     (deferred_scale()), which folds it into its unscale. Where the reduction writes every
//     element of a partition that holds nothing yet (overwrites() and fresh()), the collective
//     writes straight into it (direct());
//   - the flat gradient buffer itself (the alias: one rank, where may_alias() says the identity
//     reduction is exact): every bucket is in place already, nothing moves, and the step's
//     zeroing of the partition (overwrites() is false) starts the next window;
//   - a partition in host memory (ZeRO-Offload): each reduced chunk leaves the device as soon
//     as its reduction is complete, on a copy stream into page-locked memory (straight into the
//     partition when the sums overwrite it, else through a staging chunk that the host adds
//     in), so no gradient partition is kept on the device; the waiting and the adding are a
//     worker's (host_landing.h), not the backward's thread, and it may sum the squares of the
//     final chunks for the norm as they land (sum_squares_on_landing()).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>

#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/phase_times.h"
#include "dscpp/zero/reduce_options.h"

namespace dscpp::zero {

class PartitionSink {
 public:
  // partition: layout.partition elements (the whole buffer at stage 0), fp32 or the 16-bit
  // type; it is the alias when it shares flat_grads' storage (then it must be one may_alias()
  // allows: a dscpp::Error otherwise); it holds nothing yet. on_host: it is in host memory,
  // whatever the device of a CPU run.
  static std::unique_ptr<PartitionSink> make(const FlatLayout& layout, const ReduceOptions& options,
                                             int group_size, at::TensorOptions grad_options,
                                             const at::Tensor& flat_grads, at::Tensor partition,
                                             bool on_host);
  // Whether a gradient partition of type partition_type (on the host: on_host) may be the flat
  // gradient buffer itself, the gradients being of type grad_type and reduced over group_size
  // ranks with `options`: the reduction is then the identity on every element and the
  // partition's values are the flat buffer's bit for bit. One rank; the same type; on the
  // device; no conversion for the communication; no scaling before the sum (prescale,
  // predivide); and nothing after it that an fp32 partition would have to apply itself (a
  // 16-bit one defers the averaging to the step).
  static bool may_alias(const ReduceOptions& options, int group_size, at::ScalarType grad_type,
                        at::ScalarType partition_type, bool on_host);
  // (make's arguments; the forms' own constructor)
  PartitionSink(const FlatLayout& layout, const ReduceOptions& options, int group_size,
                at::TensorOptions grad_options, at::Tensor partition);
  virtual ~PartitionSink() = default;

  const at::Tensor& partition() const { return partition_; }
  at::Tensor target(int bucket) const;  // the bucket's share of the partition
  // Whether it holds nothing yet: until the first reducing window ends (window_done()), and
  // again once the step has zeroed it (cleared()).
  bool fresh() const { return fresh_; }
  virtual void cleared() { fresh_ = true; }
  // Whether the next reduction writes every element of the partition rather than adding to
  // it (a 16-bit partition filled by reduce-scatters), so that it need not be zeroed first.
  // Never for the alias: the flat buffer accumulates into what it holds.
  virtual bool overwrites() const;
  // The averaging after the sum, and what the partition's values are still to be multiplied
  // by to be averaged gradients: 1 for an fp32 partition, 1/world for a 16-bit one.
  double post_scale() const;
  double deferred_scale() const { return raw() ? post_scale() : 1.0; }

  // Whether a bucket's reduction writes its sums straight into target(b) (then receive() is
  // not called for it).
  virtual bool direct() const = 0;
  // Whether bucket b's per-bucket storage may be its share of the partition itself (one rank:
  // the identity reduction then writes nothing).
  virtual bool storage_in_partition(int /*bucket*/) const { return false; }
  // Bucket b's reduced chunk (its whole bucket at stage 0) into the partition.
  virtual void receive(int bucket, const at::Tensor& source) = 0;
  // Whether the sink reports a bucket complete itself, once it is in the partition (on its
  // worker), rather than when receive() returns.
  virtual bool reports_completion() const { return false; }
  virtual void set_on_complete(std::function<void(int)> /*fn*/) {}

  // A reducing window starts (reduce: this backward reduces); ends, after its last receive
  // (waits for what is still on its way).
  virtual void begin_window(bool /*reduce*/) {}
  virtual void end_window() { fresh_ = false; }
  virtual void drain() {}  // waits for what is on its way (errors dropped: the destructor's)

  virtual bool aliases_flat() const { return false; }
  virtual bool on_host() const { return false; }
  // The host partition's sums of squares (see above); unset elsewhere.
  virtual void sum_squares_on_landing() {}
  virtual std::optional<double> landed_sumsq() const { return std::nullopt; }
  virtual void take_phase_times(PhaseTimes& /*times*/) {}
  virtual int64_t device_bytes() const { return 0; }  // held by chunks on their way

 protected:
  bool raw() const { return partition_.scalar_type() != at::kFloat; }
  int averaged_over() const {
    return options_.average_over > 0 ? options_.average_over : group_size_;
  }

  const FlatLayout& layout_;
  ReduceOptions options_;
  int group_size_;
  at::TensorOptions grad_options_;
  at::Tensor partition_;
  bool fresh_ = true;
};

}  // namespace dscpp::zero
