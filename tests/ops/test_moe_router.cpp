// The MoE router's top-k (ops::moe_topk_route) on the ATen path (CPU) against a reference
// written here: each token's experts sorted by score plus bias, the weights from the unbiased
// scores normalised over the chosen (or not), scaled, the routes per expert counted; its
// gradient against finite differences; the arguments it refuses.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/moe_router.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::moe_topk_route;
using dscpp::ops::MoeTopK;
using dscpp::ops::test::max_gradient_error;
using dscpp::ops::test::rel_err;

TEST(MoeTopK, ChoosesByScorePlusBiasAndWeighsByTheScores) {
  at::manual_seed(51);
  const int64_t tokens = 9, experts = 12, k = 4;
  const at::Tensor scores = at::rand({tokens, experts});
  const at::Tensor bias = at::randn({experts}) * 0.3;
  for (const bool normalize : {true, false}) {
    SCOPED_TRACE(normalize);
    const MoeTopK t = moe_topk_route(scores, bias, k, normalize, 2.5);
    ASSERT_EQ(t.indices.sizes(), at::IntArrayRef({tokens, k}));
    ASSERT_EQ(t.indices.scalar_type(), at::kLong);
    std::vector<int64_t> counts(experts, 0);
    for (int64_t s = 0; s < tokens; ++s) {
      std::vector<int64_t> order(experts);
      std::iota(order.begin(), order.end(), 0);
      auto sel = [&](int64_t e) { return scores[s][e].item<float>() + bias[e].item<float>(); };
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return sel(a) > sel(b); });
      double total = 0;
      for (int64_t j = 0; j < k; ++j) total += scores[s][order[j]].item<float>();
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(t.indices[s][j].item<int64_t>(), order[j]) << "token " << s << " choice " << j;
        const double w = scores[s][order[j]].item<float>() * 2.5 / (normalize ? total : 1.0);
        EXPECT_NEAR(t.weights[s][j].item<float>(), w, 1e-6 * w);
        ++counts[order[j]];
      }
    }
    ASSERT_EQ(t.counts.scalar_type(), at::kLong);
    for (int64_t e = 0; e < experts; ++e) EXPECT_EQ(t.counts[e].item<int64_t>(), counts[e]);
  }
}

TEST(MoeTopK, WeightsGradientMatchesFiniteDifferences) {
  at::manual_seed(52);
  // float64 scores are not the op's (fp32 only): differentiate the fp32 op through a cast.
  const at::Tensor s64 = at::rand({5, 8}, at::kDouble).add_(0.1).requires_grad_();
  const at::Tensor indices = moe_topk_route(s64.detach().to(at::kFloat), {}, 3, true, 1.0).indices;
  for (const bool normalize : {true, false}) {
    SCOPED_TRACE(normalize);
    const auto f = [&](const std::vector<at::Tensor>& in) {
      // The choice is piecewise constant: fixed at the unperturbed point's, as the op's own
      // gradient assumes; the weights as the op forms them, in float64.
      at::Tensor w = in[0].gather(1, indices);
      return normalize ? w / w.sum(1, true) * 1.5 : w * 1.5;
    };
    const at::Tensor g = at::randn({5, 3}, at::kDouble);
    const double fd = max_gradient_error(f, {s64}, g);
    EXPECT_LT(fd, 1e-8);  // the reference itself is right
    const at::Tensor x = s64.detach().to(at::kFloat).requires_grad_();
    moe_topk_route(x, {}, 3, normalize, 1.5).weights.backward(g.to(at::kFloat));
    const at::Tensor r = s64.detach().clone().requires_grad_();
    f({r}).backward(g);
    EXPECT_LT(rel_err(x.grad(), r.grad()), 1e-6);
  }
}

TEST(MoeTopK, RefusesWhatItCannotRoute) {
  const at::Tensor s = at::rand({4, 8});
  EXPECT_THROW(moe_topk_route(s, {}, 0, true, 1.0), dscpp::Error);
  EXPECT_THROW(moe_topk_route(s, {}, 9, true, 1.0), dscpp::Error);
  EXPECT_THROW(moe_topk_route(s.to(at::kDouble), {}, 2, true, 1.0), dscpp::Error);
  EXPECT_THROW(moe_topk_route(s, at::zeros({7}), 2, true, 1.0), dscpp::Error);
  EXPECT_THROW(moe_topk_route(s.view({-1}), {}, 2, true, 1.0), dscpp::Error);
}

}  // namespace
