// The MoE router's top-k kernels against the ATen path (ops::moe_topk_route with allow_kernels
// false, on the CPU): random fp32 scores, 1 to 1,024 experts, k = 1 to 32, with and without the
// bias, normalised or not, scaled: the same indices and counts (exactly), the same weights and
// the same gradient of the scores. Then the whole MoE layer of moe_1gpu's kind (sigmoid scores
// with the expert bias, top-8, dropless, SwiGLU grouped experts, a shared expert) forward and
// backward in bf16 without one wait on the host (CUDA's sync debug mode). Skips without a GPU.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <algorithm>

#include <cstdint>
#include <vector>

#include "dscpp/nn/moe/experts.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/ops/moe_router.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::moe_topk_route;
using dscpp::ops::MoeTopK;
using dscpp::ops::test::rel_err;

TEST(MoeTopKCuda, KernelsMatchTheAtenPath) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(61);
  struct Case {
    int64_t tokens, experts, k;
  };
  for (const Case c : {Case{1, 1, 1}, Case{7, 8, 3}, Case{513, 64, 8}, Case{300, 100, 32},
                       Case{64, 1024, 8}, Case{8192, 64, 8}})
    for (const bool with_bias : {false, true})
      for (const bool normalize : {true, false}) {
        SCOPED_TRACE(fmt::format("tokens {} experts {} k {} bias {} normalize {}", c.tokens,
                                 c.experts, c.k, with_bias, normalize));
        // Selection scores a random permutation of (i + 0.5) / E + 1 per token, 1 / E apart, and
        // a bias of up to 2 / E that reorders them: no two experts tie, whatever the rounding
        // of scores + bias, so both paths must make the same choices.
        const at::Tensor sel =
            (std::get<1>(at::rand({c.tokens, c.experts}).sort(1)).to(at::kFloat) + 0.5) /
                c.experts +
            1.0;
        const at::Tensor bias =
            with_bias ? (at::rand({c.experts}) - 0.5) * (4.0 / c.experts) : at::Tensor();
        const at::Tensor scores = with_bias ? sel - bias : sel;
        const at::Tensor g = at::randn({c.tokens, c.k});
        const at::Tensor x = scores.to(at::kCUDA).requires_grad_();
        ASSERT_TRUE(dscpp::ops::moe_topk_route_uses_kernels(x, c.k));
        const MoeTopK got =
            moe_topk_route(x, with_bias ? bias.to(at::kCUDA) : bias, c.k, normalize, 1.25);
        const at::Tensor r = scores.clone().requires_grad_();
        const MoeTopK want = moe_topk_route(r, bias, c.k, normalize, 1.25, false);
        EXPECT_TRUE(got.indices.cpu().equal(want.indices)) << "indices";
        EXPECT_TRUE(got.counts.cpu().equal(want.counts)) << "counts";
        EXPECT_LT(rel_err(got.weights, want.weights), 1e-6) << "weights";
        got.weights.backward(g.to(at::kCUDA));
        want.weights.backward(g);
        // Against the incoming gradient's scale as well: with one expert and normalisation the
        // weight is constant, the true gradient 0, and the reference holds only its rounding.
        const double scale = std::max(r.grad().norm().item<double>(), g.norm().item<double>());
        EXPECT_LT((x.grad().cpu() - r.grad()).norm().item<double>() / scale, 1e-5) << "d scores";
      }
}

namespace moe = dscpp::nn::moe;

TEST(MoeTopKCuda, MoeLayerNeverWaitsOnTheHost) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(62);
  const int64_t hidden = 128, tokens = 512;
  moe::MoEOptions o(hidden);
  o.num_experts(16)
      .k(8)
      .capacity_factor(0.0)
      .drop_tokens(false)
      .score_function(moe::ScoreFunction::kSigmoid)
      .enable_expert_bias(true)
      .ffn_hidden_size(64)
      .activation(moe::Activation::kSwiglu)
      .shared_expert(torch::nn::AnyModule(moe::ExpertMLP(
          moe::ExpertMLPOptions(hidden, 64).activation(moe::Activation::kSwiglu).bias(false))));
  moe::MoE layer(o);
  layer->to(at::kCUDA, at::kBFloat16);
  const at::Tensor x =
      at::randn({2, tokens / 2, hidden}).to(at::kCUDA, at::kBFloat16).requires_grad_(true);
  const at::Tensor grad = at::randn({2, tokens / 2, hidden}).to(at::kCUDA, at::kBFloat16);
  std::vector<at::Tensor> inputs = {x};
  for (const auto& p : layer->parameters()) inputs.push_back(p);
  torch::autograd::grad({layer->forward(x).output}, inputs, {grad});  // warm: allocations
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  bool ok = true;
  try {
    const moe::MoEOutput out = layer->forward(x);
    torch::autograd::grad({out.output}, inputs, {grad});
  } catch (const std::exception& e) {
    ok = false;
    ADD_FAILURE() << "the MoE layer synchronised: " << e.what();
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  EXPECT_TRUE(ok);
}

}  // namespace
