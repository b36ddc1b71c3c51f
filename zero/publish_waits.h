// Stages 1-2 with dscpp_deferred_allgather, for a model given as layers: the step leaves each
// bucket's all-gather in flight, and before a layer's forward these hooks wait for the
// buckets that hold its parameters (on a GPU the compute stream waits, not the host), so the
// later layers' parameters keep arriving while the first layers compute.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

#include "dscpp/nn/layer_hooks.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::zero {

class PublishWaits final : public nn::LayerHooks {
 public:
  // layer_buckets[l]: the buckets holding layer l's parameters.
  PublishWaits(ZeroOptimizer& zero, std::vector<std::vector<int>> layer_buckets)
      : zero_(zero), layer_buckets_(std::move(layer_buckets)) {}
  void before_forward(int layer) override {
    for (int b : layer_buckets_.at(layer)) zero_.wait_published(b);
  }
  at::Tensor after_forward(int /*layer*/, const at::Tensor& output) override { return output; }

 private:
  ZeroOptimizer& zero_;
  std::vector<std::vector<int>> layer_buckets_;
};

}  // namespace dscpp::zero
