// The gradient partition's three forms: see partition_sink.h.
#include "dscpp/zero/partition_sink.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <utility>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/zero/host_landing.h"

namespace dscpp::zero {

namespace {

// A partition on the device: the sums added in (widened and averaged for fp32), or written by
// the collective itself where they overwrite a partition that holds nothing yet.
class DevicePartition final : public PartitionSink {
 public:
  using PartitionSink::PartitionSink;

  bool direct() const override { return fresh_ && overwrites(); }
  bool storage_in_partition(int b) const override {
    const auto& bucket = layout_.buckets[b];
    return group_size_ == 1 && fresh_ && overwrites() &&
           bucket.chunk == bucket.end - bucket.begin && !options_.prescale_gradients &&
           options_.gradient_predivide_factor == 1.0 &&
           partition_.device() == grad_options_.device();
  }
  void receive(int b, const at::Tensor& source) override {
    at::NoGradGuard no_grad;
    at::Tensor into = target(b);
    const double post = post_scale();
    if (raw())
      into.add_(source.to(partition_.scalar_type()));
    else if (post == 1.0)
      into.add_(source.to(at::kFloat));
    else
      into.add_(source.to(at::kFloat), post);
  }
};

// The partition is the flat gradient buffer: the identity reduction leaves every bucket where
// the step reads it.
class FlatAlias final : public PartitionSink {
 public:
  using PartitionSink::PartitionSink;

  bool overwrites() const override { return false; }
  bool direct() const override { return true; }
  void receive(int, const at::Tensor&) override {
    throw dscpp::Error("PartitionSink: the alias receives nothing (its reductions are in place)");
  }
  bool aliases_flat() const override { return true; }
};

// A partition in host memory: each chunk lands through HostLanding's worker, which may sum the
// squares of the window's final chunks.
class HostPartition final : public PartitionSink {
 public:
  HostPartition(const FlatLayout& layout, const ReduceOptions& options, int group_size,
                at::TensorOptions grad_options, at::Tensor partition)
      : PartitionSink(layout, options, group_size, grad_options, std::move(partition)),
        landing_(grad_options.device()) {}
  ~HostPartition() override { drain(); }

  bool direct() const override { return false; }
  void receive(int b, const at::Tensor& source) override {
    at::Tensor into = target(b);
    // The sums of a 16-bit partition that holds nothing yet go straight into it.
    const bool straight = fresh_ && overwrites() && source.scalar_type() == into.scalar_type();
    landing_.land(b, source, std::move(into), straight, raw() ? 1.0 : post_scale(),
                  summing_ ? &sumsq_[b] : nullptr);
  }
  bool reports_completion() const override { return true; }
  void set_on_complete(std::function<void(int)> fn) override {
    landing_.set_on_landed(std::move(fn));
  }
  void begin_window(bool reduce) override {
    landed_valid_ = false;  // (this backward changes the partition)
    summing_ = reduce && sum_next_;
    sum_next_ = false;
    if (summing_) sumsq_.assign(layout_.buckets.size(), 0.0);
  }
  void end_window() override {
    landing_.drain();
    landed_valid_ = summing_;  // (every bucket has landed, each with its sum)
    summing_ = false;
    fresh_ = false;
  }
  void drain() override {
    try {
      landing_.drain();
    } catch (...) {  // (a failed landing was reported by the end_window() that waited for it)
    }
  }
  void cleared() override {
    fresh_ = true;
    landed_valid_ = false;
  }
  bool on_host() const override { return true; }
  void sum_squares_on_landing() override { sum_next_ = true; }
  std::optional<double> landed_sumsq() const override {
    if (!landed_valid_) return std::nullopt;
    double total = 0;
    for (double s : sumsq_) total += s;  // (in bucket order)
    return total;
  }
  void take_phase_times(PhaseTimes& times) override { landing_.take_times(times); }
  int64_t device_bytes() const override { return landing_.device_bytes(); }

 private:
  HostLanding landing_;
  bool sum_next_ = false, summing_ = false, landed_valid_ = false;
  std::vector<double> sumsq_;  // per bucket, while summing_
};

}  // namespace

PartitionSink::PartitionSink(const FlatLayout& layout, const ReduceOptions& options, int group_size,
                             at::TensorOptions grad_options, at::Tensor partition)
    : layout_(layout),
      options_(options),
      group_size_(group_size),
      grad_options_(grad_options),
      partition_(std::move(partition)) {}

std::unique_ptr<PartitionSink> PartitionSink::make(const FlatLayout& layout,
                                                   const ReduceOptions& options, int group_size,
                                                   at::TensorOptions grad_options,
                                                   const at::Tensor& flat_grads,
                                                   at::Tensor partition, bool on_host) {
  const bool aliased =
      flat_grads.defined() && partition.defined() && partition.data_ptr() == flat_grads.data_ptr();
  if (aliased) {
    if (partition.numel() != flat_grads.numel() || partition.device() != flat_grads.device() ||
        !may_alias(options, group_size, flat_grads.scalar_type(), partition.scalar_type(), on_host))
      throw dscpp::Error(
          "GradBuckets: the gradient partition is the flat gradient buffer, but the reduction "
          "is not the identity there (several ranks, another type or size, a host partition, "
          "a communication type or a pre-/post-scaling): give the partition its own buffer");
    return std::make_unique<FlatAlias>(layout, options, group_size, grad_options,
                                       std::move(partition));
  }
  if (on_host)
    return std::make_unique<HostPartition>(layout, options, group_size, grad_options,
                                           std::move(partition));
  return std::make_unique<DevicePartition>(layout, options, group_size, grad_options,
                                           std::move(partition));
}

bool PartitionSink::may_alias(const ReduceOptions& options, int group_size,
                              at::ScalarType grad_type, at::ScalarType partition_type,
                              bool on_host) {
  // The identity on one rank: the flat slice itself is the reduced data when nothing converts
  // or scales it, and the sums go into the partition unchanged (a 16-bit partition, or an fp32
  // one whose post-scale is 1), which for the alias is already the case.
  const int averaged = options.average_over > 0 ? options.average_over : group_size;
  const bool post_one = partition_type != at::kFloat || averaged == 1;
  return group_size == 1 && !on_host && grad_type == partition_type &&
         options.communication_data_type.value_or(grad_type) == grad_type &&
         !options.prescale_gradients && options.gradient_predivide_factor == 1.0 && post_one;
}

at::Tensor PartitionSink::target(int b) const {
  const auto& bucket = layout_.buckets[b];
  return options_.scatter
             ? partition_.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk)
             : partition_.slice(0, bucket.begin, bucket.end);
}

bool PartitionSink::overwrites() const {
  // The one rule for a reduction straight into the partition: every bucket is reduced by every
  // backward (finish() issues the ones backward left), each by a reduce-scatter whose data is
  // of the partition's type; or, on one rank, stage 0's identity reduction of the whole bucket
  // (an all-reduce over several ranks adds into the partition, which must then start at zero).
  const auto comm_type =
      options_.communication_data_type.value_or(grad_options_.dtype().toScalarType());
  const bool whole = options_.scatter ? options_.use_reduce_scatter : group_size_ == 1;
  return raw() && whole && comm_type == partition_.scalar_type() &&
         grad_options_.dtype().toScalarType() == partition_.scalar_type();
}

double PartitionSink::post_scale() const {
  const int n = averaged_over();
  return options_.prescale_gradients ? 1.0 : options_.gradient_predivide_factor / n;
}

}  // namespace dscpp::zero
