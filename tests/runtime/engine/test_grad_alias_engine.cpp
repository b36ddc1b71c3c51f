// The engine on one rank at ZeRO stages 0-1, bf16, four micro-steps a window and
// data_types.grad_accum_dtype bf16 (bench/configs/moe_1gpu_bf16_zero1.json's shape): the
// gradient partition is the flat gradient buffer (ZeroOptions::alias_grad_partition), its
// memory breakdown lists the gradients once, and it trains bit for bit as the same run where
// the alias is not possible (communication_data_type fp32: the boundary widens the buffer and
// adds it, narrowed again, into a partition of its own; bf16 -> fp32 -> bf16 and 0 + x are
// exact, so the two runs must agree in every bit). With the default fp32 accumulation, or with
// the communication type, both buffers are there and listed.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "dscpp/dscpp.h"
#include "dscpp/zero/memory_breakdown.h"
#include "dscpp/zero/zero_optimizer.h"

using nlohmann::json;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", torch::nn::Linear(6, 16));
    b = register_module("b", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(at::Tensor x) { return b(a(x).tanh()); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

json config(int stage) {
  return {{"train_batch_size", 8},
          {"train_micro_batch_size_per_gpu", 2},  // four micro-steps a window on one rank
          {"gradient_clipping", 0.5},
          {"bf16", {{"enabled", true}}},
          {"data_types", {{"grad_accum_dtype", "bf16"}}},
          {"zero_optimization", {{"stage", stage}}},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.02}, {"weight_decay", 0.1}}}}}};
}

struct Trained {
  std::vector<float> losses;
  std::vector<at::Tensor> weights;
  bool aliased = false;
  int64_t flat = 0, partition = 0;  // memory_breakdown's grads16.flat and grad_partition
};

Trained train(const json& cfg, int windows = 3) {
  torch::manual_seed(5);
  Net model;
  auto engine = dscpp::initialize(model, cfg);
  Trained t;
  at::manual_seed(9);
  for (int k = 0; k < 4 * windows; ++k) {
    at::Tensor x = at::randn({2, 6}).to(engine.device(), at::kBFloat16);
    at::Tensor y = at::randn({2, 3}).to(engine.device());
    at::Tensor loss = (engine.forward(x).to(at::kFloat) - y).square().mean();
    t.losses.push_back(loss.item<float>());
    engine.backward(loss);
    engine.step();
  }
  EXPECT_EQ(engine.global_steps(), windows);
  // (after training: the buffers exist from the first backward on)
  t.aliased = engine.core().zero_optimizer().grads_aliased();
  const auto m = engine.core().memory_breakdown();
  t.flat = dscpp::zero::bytes_named(m, "grads16.flat");
  t.partition = dscpp::zero::bytes_named(m, "grad_partition");
  for (const auto& p : model->parameters()) t.weights.push_back(p.detach().clone());
  return t;
}

}  // namespace

TEST(GradAliasEngine, OneRankBf16AccumulationHoldsTheGradientsOnceAndTrainsAsTwoBuffers) {
  for (int stage : {0, 1}) {
    const json cfg = config(stage);
    json two = cfg;
    two["communication_data_type"] = "fp32";
    const Trained alias = train(cfg), separate = train(two);
    ASSERT_TRUE(alias.aliased) << "stage " << stage;
    ASSERT_FALSE(separate.aliased) << "stage " << stage;
    // One buffer of the model's bf16 gradients (3 * 16 + 16 * 6 + 16 + 3 = 163 elements,
    // padded to the layout's alignment), listed as the partition; both with the alias off.
    EXPECT_EQ(alias.flat, 0) << "stage " << stage;
    EXPECT_GE(alias.partition, 163 * 2) << "stage " << stage;
    EXPECT_EQ(separate.flat, alias.partition) << "stage " << stage;
    EXPECT_EQ(separate.partition, alias.partition) << "stage " << stage;
    ASSERT_EQ(alias.losses.size(), separate.losses.size());
    for (size_t k = 0; k < alias.losses.size(); ++k)
      EXPECT_EQ(alias.losses[k], separate.losses[k]) << "stage " << stage << " micro-step " << k;
    EXPECT_NE(alias.losses.front(), alias.losses.back()) << "(it trains)";
    for (size_t i = 0; i < alias.weights.size(); ++i)
      EXPECT_TRUE(alias.weights[i].equal(separate.weights[i]))
          << "stage " << stage << " parameter " << i;
  }
}

TEST(GradAliasEngine, Fp32AccumulationKeepsItsOwnPartition) {
  json cfg = config(1);
  cfg.erase("data_types");  // bf16 gradients accumulated into an fp32 partition
  const Trained t = train(cfg, 1);
  EXPECT_FALSE(t.aliased);
  EXPECT_GT(t.flat, 0);
  EXPECT_EQ(t.partition, 2 * t.flat);  // fp32 against bf16
}
