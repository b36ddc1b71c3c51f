// GradBuckets: see grad_buckets.h.
#include "dscpp/zero/grad_buckets.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <utility>

#include "dscpp/error.h"

namespace dscpp::zero {

GradBuckets::GradBuckets(const FlatLayout& layout, at::Tensor flat_grads,
                         std::vector<at::Tensor> params, at::TensorOptions grad_options,
                         std::shared_ptr<comm::ProcessGroup> group, ReduceOptions options)
    : layout_(layout),
      flat_grads_(std::move(flat_grads)),
      params_(std::move(params)),
      grad_options_(grad_options),
      storage_(layout.buckets.size()),
      written_(layout.params.size(), 0),
      dirty_(layout.params.size(), 0),
      group_(std::move(group)),
      options_(options),
      pending_(layout.buckets.size()),
      ready_(layout.params.size(), 0),
      works_(layout.buckets.size()),
      results_(layout.buckets.size()),
      direct_(layout.buckets.size(), 0),
      ready_at_launch_(layout.buckets.size(), 0) {
  wait_blocks_host_ = group_->backend_name() != "nccl";
  // Flat mode: autograd accumulates each gradient straight into the flat gradient buffer.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (per_bucket()) {
      params_[i].mutable_grad().reset();
      continue;
    }
    const auto& lp = layout_.params[i];
    grad_views_.push_back(
        flat_grads_.slice(0, lp.offset, lp.offset + lp.numel).view(params_[i].sizes()));
    params_[i].mutable_grad() = grad_views_.back();
  }
}

void GradBuckets::set_on_complete(std::function<void(int)> fn) {
  on_complete_ = fn;
  if (sink_) sink_->set_on_complete(std::move(fn));
}

void GradBuckets::set_partition(at::Tensor partition, bool on_host) {
  if (sink_) sink_->drain();
  sink_ = PartitionSink::make(layout_, options_, group_->size(), grad_options_, flat_grads_,
                              std::move(partition), on_host);
  sink_->set_on_complete(on_complete_);
}

int64_t GradBuckets::in_flight_bytes() const {
  int64_t n = 0;
  for (size_t b = 0; b < storage_.size(); ++b)
    if (!in_partition(static_cast<int>(b))) n += bytes_of(storage_[b]);  // (else: the partition's)
  for (size_t b = 0; b < results_.size(); ++b) {
    const at::Tensor& r = results_[b];
    // (a direct reduction writes the partition, a flat bucket is the flat buffer's)
    if (!r.defined() || direct_[b] || (flat_grads_.defined() && r.is_alias_of(flat_grads_)))
      continue;
    n += bytes_of(r);
  }
  // (a flat bucket's chunk landing is counted with the flat buffer: the worker's count is an
  // upper bound of what the buckets add)
  if (sink_ && !flat_grads_.defined()) n += sink_->device_bytes();
  return n;
}

void GradBuckets::cleared() {
  sink_->cleared();
  // The alias: the step zeroed the partition, which is the flat buffer (overwrites() is false
  // for it), so the first product into each view may overwrite it again.
  if (sink_->aliases_flat()) std::fill(dirty_.begin(), dirty_.end(), 0);
}

void GradBuckets::add_memory(MemoryBreakdown& m) const {
  // (the alias: the buffer is the partition, listed once, by its owner)
  if (flat_grads_.defined() && !(sink_ && sink_->aliases_flat()))
    m.push_back({"grads16.flat", bytes_of(flat_grads_), true});
  m.push_back({"reduce_buckets", in_flight_bytes(), true});
}

void GradBuckets::begin(bool reduce) {
  // A module's zero_grad() (set_to_none by default) or an assignment to .grad detaches a
  // parameter from the flat buffer, and autograd would then accumulate where no bucket
  // looks: point it back before autograd runs. With per-bucket storage .grad must start
  // empty, so that autograd's result is this backward's gradient alone.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (per_bucket()) {
      params_[i].mutable_grad().reset();
    } else if (!params_[i].grad().is_same(grad_views_[i])) {
      params_[i].mutable_grad() = grad_views_[i];
    }
  }
  // Per-bucket storage exists only while a bucket waits for its collective: a micro-step
  // that does not reduce would have nowhere to keep its gradients.
  if (per_bucket() && !reduce)
    throw dscpp::Error("GradBuckets: per-bucket gradient storage reduces every micro-step");
  reducing_ = in_backward_ = reduce;
  std::fill(ready_.begin(), ready_.end(), 0);
  sink_->begin_window(reduce);
  next_launch_ = next_complete_ = 0;
  ready_calls_ = 0;
  for (size_t b = 0; b < layout_.buckets.size(); ++b)
    pending_[b] = static_cast<int>(layout_.buckets[b].params.size());
}

void GradBuckets::mark_ready(int param) {
  ++ready_calls_;
  if (!per_bucket()) dirty_[param] = 1;  // (autograd accumulates into the view)
  if (!reducing_) return;
  const auto& lp = layout_.params[param];
  if (per_bucket()) {
    at::Tensor& grad = params_[param].mutable_grad();
    if (grad.defined()) {
      at::NoGradGuard no_grad;
      const int64_t offset = lp.offset - layout_.buckets[lp.bucket].begin;
      at::Tensor into = storage(lp.bucket).slice(0, offset, offset + lp.numel);
      // A product wrote part of it in place already (a tied weight): add autograd's part.
      if (written_[param])
        into.add_(grad.reshape({-1}));
      else
        into.copy_(grad.reshape({-1}));
      ++copies_;
      written_[param] = 1;
      // The copy is the gradient now; autograd makes a fresh .grad next backward.
      grad.reset();
    }
  }
  if (ready_[param]) return;  // (a second call adds its gradient, and counts once)
  ready_[param] = 1;
  --pending_[lp.bucket];
  launch_ready();
}

void GradBuckets::units_complete_above(int unit) {
  if (!reducing_) return;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const auto& bucket = layout_.buckets[b];
    if (bucket.unit <= unit) continue;
    for (int i : bucket.params) {
      if (ready_[i]) continue;
      // No gradient came: its place in the bucket is zeroed when the bucket goes (bucket_data;
      // in the flat buffer it holds what earlier micro-steps left, or zeros).
      ready_[i] = 1;
      --pending_[b];
    }
  }
  launch_ready();
}

at::Tensor GradBuckets::slot(int param, bool& accumulate) {
  const auto& lp = layout_.params[param];
  if (!per_bucket()) {
    accumulate = dirty_[param] != 0;
    return grad_views_[param];
  }
  // Only while its bucket waits for this parameter (not after its launch), and in the whole
  // parameter's shape (a stage-3 parameter released meanwhile has none).
  if (!reducing_ || next_launch_ > lp.bucket || params_[param].numel() != lp.numel) return {};
  accumulate = written_[param] != 0;
  const int64_t offset = lp.offset - layout_.buckets[lp.bucket].begin;
  return storage(lp.bucket).slice(0, offset, offset + lp.numel).view(params_[param].sizes());
}

void GradBuckets::written(int param) {
  if (per_bucket())
    written_[param] = 1;
  else
    dirty_[param] = 1;
}

at::Tensor& GradBuckets::storage(int b) {
  at::Tensor& store = storage_[b];
  if (!store.defined()) {
    const auto& bucket = layout_.buckets[b];
    store =
        in_partition(b) ? sink_->target(b) : at::empty({bucket.end - bucket.begin}, grad_options_);
    note_in_flight();
  }
  return store;
}

at::Tensor GradBuckets::bucket_data(int b) {
  const auto& bucket = layout_.buckets[b];
  at::Tensor& store = storage_[b];
  if (!store.defined()) {  // no gradient reached this bucket (unused parameters)
    storage(b).zero_();
  } else {
    // Padding (between parameters in a whole-parameter layout, after the last in every
    // layout) and parameters without a gradient are zeros; bucket.params go by offset.
    int64_t end = bucket.begin;
    for (int i : bucket.params) {
      const auto& lp = layout_.params[i];
      if (lp.offset > end) store.slice(0, end - bucket.begin, lp.offset - bucket.begin).zero_();
      if (!written_[i])
        store.slice(0, lp.offset - bucket.begin, lp.offset - bucket.begin + lp.numel).zero_();
      end = std::max(end, lp.offset + lp.numel);
    }
    if (end < bucket.end) store.slice(0, end - bucket.begin).zero_();
  }
  for (int i : bucket.params) written_[i] = 0;
  return std::exchange(store, at::Tensor());
}

void GradBuckets::launch_ready() {
  while (next_launch_ < static_cast<int>(layout_.buckets.size()) && pending_[next_launch_] <= 0)
    launch(next_launch_++);
}

void GradBuckets::launch(int b) {
  const auto& bucket = layout_.buckets[b];
  const int n = group_->size(), averaged = averaged_over();
  ready_at_launch_[b] = ready_calls_;
  // Per-bucket storage is dropped here: the collective keeps it alive until it has run.
  at::Tensor data = per_bucket() ? bucket_data(b) : flat_grads_.slice(0, bucket.begin, bucket.end);
  if (options_.communication_data_type && *options_.communication_data_type != data.scalar_type())
    data = data.to(*options_.communication_data_type);
  // DeepSpeed's averaging: divide before the sum (prescale_gradients), or divide by the
  // predivide factor before and by world / factor after.
  const double pre =
      options_.prescale_gradients ? 1.0 / averaged : 1.0 / options_.gradient_predivide_factor;
  if (pre != 1.0) data.mul_(pre);
  if (n == 1) {
    // One rank: the reduction is the identity. Into the partition directly where the
    // collective would have written it (the storage may be that slice already). The alias:
    // the data is the partition's own slice, which holds the sums already, fresh or not.
    direct_[b] = sink_->direct();
    if (direct_[b]) {
      at::Tensor into = sink_->target(b);
      if (into.data_ptr() != data.data_ptr()) {
        at::NoGradGuard no_grad;
        into.copy_(data);
      }
    } else {
      results_[b] = data;
    }
    works_[b] = comm::Work();
  } else if (options_.scatter && options_.use_reduce_scatter) {
    // Into a 16-bit partition that holds nothing yet, the collective writes the sums itself.
    direct_[b] = sink_->direct();
    results_[b] = direct_[b] ? sink_->target(b) : at::empty({bucket.chunk}, data.options());
    works_[b] = group_->reduce_scatter(results_[b], data, comm::ReduceOp::kSum);
  } else {
    results_[b] = data;
    works_[b] = group_->all_reduce(results_[b], comm::ReduceOp::kSum);
  }
  note_in_flight();
  if (!options_.overlap_comm && may_wait()) works_[b].wait();
  complete_older(b);
}

void GradBuckets::complete_older(int launched) {
  // Double buffering, as DeepSpeed's two ipg buffers: at most kInFlight reductions
  // outstanding. The backends hold a collective's input until its work is waited on (NCCL's
  // stash), so a bucket left in flight to the end of backward keeps its buffers: every
  // bucket's, 16 GiB at 13 B parameters. Completing the older ones now (a stream wait, no
  // host synchronisation) returns their buffers while backward runs.
  // Where a wait would hold the host during backward (Gloo), only reductions already done are
  // completed: a peer may issue the next one only at finish() (header).
  while (next_complete_ <= launched) {
    if (may_wait()) {
      if (next_complete_ + kInFlight > launched) break;
    } else if (!works_[next_complete_].completed()) {
      break;
    }
    complete(next_complete_++);
  }
}

void GradBuckets::complete(int b) {
  const auto& bucket = layout_.buckets[b];
  works_[b].wait();
  at::Tensor source = results_[b];
  if (options_.scatter && !options_.use_reduce_scatter) {
    const int64_t r = group_->rank();
    source = source.slice(0, r * bucket.chunk, (r + 1) * bucket.chunk);
  }
  if (!direct_[b]) {  // (a direct reduction is in place already)
    sink_->receive(b, source);
    if (sink_->on_host()) note_in_flight();  // (its chunk on the way down)
  }
  works_[b] = comm::Work();
  results_[b] = at::Tensor();
  direct_[b] = 0;
  // (a host partition reports its own, once the chunk has landed)
  if (!sink_->reports_completion() && on_complete_) on_complete_(b);
}

void GradBuckets::finish() {
  if (!reducing_) return;
  in_backward_ = false;  // every rank issues what is left now: waiting is safe from here
  // Buckets whose parameters took no part in this backward (unused, or frozen by control
  // flow) still hold zeros and are reduced too, so every rank issues the same collectives.
  for (auto& p : pending_) p = 0;
  launch_ready();
  while (next_complete_ < static_cast<int>(layout_.buckets.size())) complete(next_complete_++);
  sink_->end_window();
  issued_early_ = 0;
  for (int calls : ready_at_launch_) issued_early_ += calls < ready_calls_;
  // The reduced 16-bit gradients are in the partition now: start the next window empty.
  // (the alias: the buffer is the partition the step reads; the step zeroes it: cleared())
  if (!per_bucket() && !sink_->aliases_flat()) {
    flat_grads_.zero_();
    std::fill(dirty_.begin(), dirty_.end(), 0);
  }
  reducing_ = false;
}

}  // namespace dscpp::zero
