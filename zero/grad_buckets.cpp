// GradBuckets: see grad_buckets.h.
#include "zero/grad_buckets.h"

#include <ATen/ATen.h>

namespace dscpp::zero {

GradBuckets::GradBuckets(const FlatLayout& layout, at::Tensor flat_grads,
                         std::shared_ptr<comm::ProcessGroup> group, ReduceOptions options)
    : layout_(layout),
      flat_grads_(std::move(flat_grads)),
      group_(std::move(group)),
      options_(options),
      pending_(layout.buckets.size()),
      works_(layout.buckets.size()),
      results_(layout.buckets.size()) {}

void GradBuckets::begin(bool reduce) {
  reducing_ = reduce;
  next_launch_ = 0;
  for (size_t b = 0; b < layout_.buckets.size(); ++b)
    pending_[b] = static_cast<int>(layout_.buckets[b].params.size());
}

void GradBuckets::mark_ready(int param) {
  if (!reducing_) return;
  --pending_[layout_.params[param].bucket];
  launch_ready();
}

void GradBuckets::launch_ready() {
  while (next_launch_ < static_cast<int>(layout_.buckets.size()) && pending_[next_launch_] <= 0)
    launch(next_launch_++);
}

void GradBuckets::launch(int b) {
  const auto& bucket = layout_.buckets[b];
  const int n = group_->size();
  at::Tensor data = flat_grads_.slice(0, bucket.begin, bucket.end);
  if (options_.communication_data_type && *options_.communication_data_type != data.scalar_type())
    data = data.to(*options_.communication_data_type);
  // DeepSpeed's averaging: divide before the sum (prescale_gradients), or divide by the
  // predivide factor before and by world / factor after.
  const double pre =
      options_.prescale_gradients ? 1.0 / n : 1.0 / options_.gradient_predivide_factor;
  if (pre != 1.0) data.mul_(pre);
  if (options_.scatter && options_.use_reduce_scatter) {
    results_[b] = at::empty({bucket.chunk}, data.options());
    works_[b] = group_->reduce_scatter(results_[b], data, comm::ReduceOp::kSum);
  } else {
    results_[b] = data;
    works_[b] = group_->all_reduce(results_[b], comm::ReduceOp::kSum);
  }
  if (!options_.overlap_comm) works_[b].wait();
}

void GradBuckets::finish(at::Tensor& grad_partition) {
  if (!reducing_) return;
  // Buckets whose parameters took no part in this backward (unused, or frozen by control
  // flow) still hold zeros and are reduced too, so every rank issues the same collectives.
  for (auto& p : pending_) p = 0;
  launch_ready();
  const int n = group_->size();
  const double post = options_.prescale_gradients ? 1.0 : options_.gradient_predivide_factor / n;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const auto& bucket = layout_.buckets[b];
    works_[b].wait();
    at::Tensor target = options_.scatter ? grad_partition.slice(0, bucket.part_offset,
                                                                bucket.part_offset + bucket.chunk)
                                         : grad_partition.slice(0, bucket.begin, bucket.end);
    at::Tensor source = results_[b];
    if (options_.scatter && !options_.use_reduce_scatter) {
      const int64_t r = group_->rank();
      source = source.slice(0, r * bucket.chunk, (r + 1) * bucket.chunk);
    }
    if (post == 1.0)
      target.add_(source.to(at::kFloat));
    else
      target.add_(source.to(at::kFloat), post);
    works_[b] = comm::Work();
    results_[b] = at::Tensor();
  }
  // The reduced 16-bit gradients are in the fp32 partition now: start the next window empty.
  flat_grads_.zero_();
  reducing_ = false;
}

}  // namespace dscpp::zero
