// ZeRO stage 3 layer by layer (docs/zero.md), DeepSpeed's parameter coordinator:
// each layer's buckets are gathered just before its forward, prefetched ahead within
// stage3_prefetch_bucket_size (elements in flight) and stage3_max_live_parameters (elements
// gathered or in flight), released after the layer unless the same buckets are used again
// within stage3_max_reuse_distance elements of other layers' gathers, and gathered again
// before the layer's backward: after_forward puts an identity autograd node on the layer's
// output whose backward runs just before the layer's own. Gradients need little here: the
// layout keeps each layer's parameters in buckets of their own, which GradBuckets
// reduce-scatters as soon as the layer's gradients are complete; that node also tells the
// buckets that backward has left the layers above (a parameter without a gradient there
// counts as zero, so its bucket goes before this layer's gathers on every rank).
//
// The step's order of uses is forward 0..L-1 then backward L-1..0; reuse distances are
// measured along it (without the backward half when autograd is off). Live elements never
// exceed max_live_parameters plus one layer: prefetches stay within max_live, and a layer's
// own gather first releases buckets kept for reuse.
//
// Parameter NVMe offload: after each use, the chunks of the next buckets in the step's order
// that are at rest are read from their files ahead, while swap buffers are free; a prefetch
// stops at a bucket whose gather would have to wait for a buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "dscpp/nn/layer_hooks.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::zero {

struct LayerGatherOptions {
  int64_t prefetch_bucket_size = 50000000;  // 0: no prefetch
  int64_t max_live_parameters = 1000000000;
  int64_t max_reuse_distance = 1000000000;
};

class LayerGather : public nn::LayerHooks {
 public:
  // layer_buckets[l]: the buckets layer l's forward uses (persistent ones are skipped).
  LayerGather(ZeroOptimizer& zero, std::vector<std::vector<int>> layer_buckets,
              LayerGatherOptions options);

  void before_forward(int layer) override;
  at::Tensor after_forward(int layer, const at::Tensor& output) override;
  // From the identity node: layer's backward is next, and layer + 1's is done.
  void before_backward(int layer);
  // After backward (or an evaluation forward): everything back to rest.
  void end_step();

  int64_t max_layer_numel() const { return max_layer_numel_; }
  int num_layers() const { return static_cast<int>(layer_buckets_.size()); }

 private:
  int position_of_forward(int layer) const { return layer; }
  int position_of_backward(int layer) const { return 2 * num_layers() - 1 - layer; }
  int layer_at(int position) const;
  // Gathers what the layer at `position` needs (waiting for it), then prefetches ahead.
  void use(int position);
  // After the layer at `position` has run: releases buckets not reused soon.
  void done(int position);
  void prefetch(int position);
  void read_ahead(int position);
  // The next position after `position` that uses bucket b, or -1.
  int next_use(int bucket, int position) const;
  int64_t bucket_numel(int bucket) const;
  int last_position() const;  // the step's last position: backward's end, or forward's

  ZeroOptimizer& zero_;
  std::vector<std::vector<int>> layer_buckets_;
  LayerGatherOptions options_;
  std::vector<int64_t> layer_numel_;    // per layer: elements of its buckets
  std::vector<std::vector<int>> uses_;  // per bucket: the layers using it, ascending
  int64_t max_layer_numel_ = 0;
  bool with_backward_ = true;  // this step's forward runs under autograd
};

}  // namespace dscpp::zero
