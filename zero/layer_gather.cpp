// LayerGather: see layer_gather.h.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/zero/layer_gather.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>
#include <set>

namespace dscpp::zero {

namespace {

// The identity at a layer's output: its backward runs when the gradient of the layer's
// output is complete, which is just before the layer's own backward.
struct LayerBoundary : torch::autograd::Function<LayerBoundary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t gather, int64_t layer) {
    ctx->saved_data["gather"] = gather;
    ctx->saved_data["layer"] = layer;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<LayerGather*>(ctx->saved_data["gather"].toInt());
    self->before_backward(static_cast<int>(ctx->saved_data["layer"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LayerGather::LayerGather(ZeroOptimizer& zero, std::vector<std::vector<int>> layer_buckets,
                         LayerGatherOptions options)
    : zero_(zero), layer_buckets_(std::move(layer_buckets)), options_(options) {
  uses_.resize(zero_.layout().buckets.size());
  for (int l = 0; l < num_layers(); ++l) {
    auto& buckets = layer_buckets_[l];
    buckets.erase(
        std::remove_if(buckets.begin(), buckets.end(), [&](int b) { return zero_.persistent(b); }),
        buckets.end());
    int64_t n = 0;
    for (int b : buckets) {
      n += bucket_numel(b);
      uses_.at(b).push_back(l);
    }
    layer_numel_.push_back(n);
    max_layer_numel_ = std::max(max_layer_numel_, n);
  }
}

int64_t LayerGather::bucket_numel(int b) const {
  const auto& bucket = zero_.layout().buckets[b];
  return bucket.end - bucket.begin;
}

int LayerGather::layer_at(int position) const {
  return position < num_layers() ? position : 2 * num_layers() - 1 - position;
}

int LayerGather::last_position() const {
  return with_backward_ ? 2 * num_layers() - 1 : num_layers() - 1;
}

int LayerGather::next_use(int b, int position) const {
  int best = -1;
  for (int l : uses_[b]) {
    for (int q : {position_of_forward(l), position_of_backward(l)}) {
      if (q > position && q <= last_position() && (best < 0 || q < best)) best = q;
    }
  }
  return best;
}

void LayerGather::before_forward(int layer) {
  if (layer == 0) with_backward_ = at::GradMode::is_enabled();
  use(position_of_forward(layer));
}

at::Tensor LayerGather::after_forward(int layer, const at::Tensor& output) {
  done(position_of_forward(layer));
  if (!with_backward_ || !output.requires_grad()) return output;
  return LayerBoundary::apply(output, reinterpret_cast<int64_t>(this), static_cast<int64_t>(layer));
}

void LayerGather::before_backward(int layer) {
  // The layers above are done on every rank at this point, before this layer's gathers: their
  // buckets go now wherever autograd gave some parameter no gradient, so the reduce-scatters
  // and the gathers on the data group come in the same order on every rank.
  zero_.layers_done_above(layer);
  if (layer + 1 < num_layers()) done(position_of_backward(layer + 1));
  use(position_of_backward(layer));
}

void LayerGather::end_step() {
  zero_.release();
  with_backward_ = true;
}

void LayerGather::use(int position) {
  const auto& need = layer_buckets_[layer_at(position)];
  int64_t missing = 0;
  for (int b : need)
    if (zero_.bucket_state(b) == ZeroOptimizer::BucketState::kRest) missing += bucket_numel(b);
  // Make room within max_live by releasing buckets kept for reuse, farthest next use first.
  if (zero_.live_numel() + missing > options_.max_live_parameters) {
    const std::set<int> needed(need.begin(), need.end());
    std::vector<std::pair<int, int>> kept;  // (next use, bucket); -1 sorts as farthest
    for (int b = 0; b < static_cast<int>(uses_.size()); ++b) {
      if (needed.count(b) || zero_.persistent(b) ||
          zero_.bucket_state(b) != ZeroOptimizer::BucketState::kGathered)
        continue;
      int q = next_use(b, position);
      kept.emplace_back(q < 0 ? std::numeric_limits<int>::max() : q, b);
    }
    std::sort(kept.rbegin(), kept.rend());
    for (const auto& [q, b] : kept) {
      if (zero_.live_numel() + missing <= options_.max_live_parameters) break;
      zero_.release_bucket(b);
    }
  }
  for (int b : need) zero_.start_gather(b);
  prefetch(position);
  for (int b : need) zero_.finish_gather(b);
  read_ahead(position);
}

void LayerGather::read_ahead(int position) {
  if (!zero_.swaps_params()) return;
  // Across the phases too: a read waits for no other rank.
  for (int q = position + 1; q <= last_position(); ++q)
    for (int b : layer_buckets_[layer_at(q)])
      if (!zero_.read_ahead(b)) return;
}

void LayerGather::prefetch(int position) {
  if (options_.prefetch_bucket_size <= 0) return;
  // Within this phase (forward or backward) only: a prefetch for the other would wait idle.
  const int phase_end = position < num_layers() ? num_layers() - 1 : last_position();
  int64_t in_flight = 0;
  for (int b = 0; b < static_cast<int>(uses_.size()); ++b)
    if (zero_.bucket_state(b) == ZeroOptimizer::BucketState::kInFlight)
      in_flight += bucket_numel(b);
  const auto& current = layer_buckets_[layer_at(position)];
  for (int q = position + 1; q <= phase_end; ++q) {
    for (int b : layer_buckets_[layer_at(q)]) {
      if (zero_.bucket_state(b) != ZeroOptimizer::BucketState::kRest) continue;
      if (std::find(current.begin(), current.end(), b) != current.end()) continue;
      const int64_t n = bucket_numel(b);
      if (in_flight + n > options_.prefetch_bucket_size ||
          zero_.live_numel() + n > options_.max_live_parameters || !zero_.can_gather_now(b))
        return;
      zero_.start_gather(b);
      in_flight += n;
    }
  }
}

void LayerGather::done(int position) {
  const int64_t inf = std::numeric_limits<int64_t>::max();
  for (int b : layer_buckets_[layer_at(position)]) {
    if (zero_.bucket_state(b) == ZeroOptimizer::BucketState::kRest) continue;
    const int q = next_use(b, position);
    int64_t distance = q < 0 ? inf : 0;
    for (int r = position + 1; q >= 0 && r < q; ++r) distance += layer_numel_[layer_at(r)];
    if (distance > options_.max_reuse_distance) zero_.release_bucket(b);
  }
}

}  // namespace dscpp::zero
