// nn::tiled_compute against the same function over the whole input: the output and the
// gradients of the input and of every parameter (float64, a two-layer MLP with a bias, tiles
// that divide the sequence and that do not, more tiles than positions), each parameter's
// accumulator running once per backward (what ZeRO's hooks count on), a parameter that needs no
// gradient, and the refusal under a split backward's scope.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <vector>

#include "dscpp/error.h"
#include "dscpp/nn/tiled_compute.h"
#include "dscpp/ops/deferred_grads.h"

namespace {

using dscpp::nn::tiled_compute;

at::Tensor mlp(const at::Tensor& x, const std::vector<at::Tensor>& w) {
  return at::matmul(at::gelu(at::matmul(x, w[0].t()) + w[1]), w[2].t());
}

std::vector<at::Tensor> weights() {
  at::manual_seed(5);
  return {at::randn({12, 6}, at::kDouble).requires_grad_(),
          at::randn({12}, at::kDouble).requires_grad_(),
          at::randn({6, 12}, at::kDouble).requires_grad_()};
}

TEST(TiledCompute, MatchesTheWholeInputAndRunsEachAccumulatorOnce) {
  const at::Tensor x0 = at::randn({2, 11, 6}, at::kDouble), g = at::randn({2, 11, 6}, at::kDouble);
  auto ref_w = weights();
  const at::Tensor rx = x0.clone().requires_grad_();
  const at::Tensor ref = mlp(rx, ref_w);
  ref.backward(g);
  for (int64_t tiles : {2, 3, 11, 40}) {
    SCOPED_TRACE(tiles);
    auto w = weights();
    int calls = 0;
    for (auto& p : w) p.register_hook([&calls](const at::Tensor&) { ++calls; });
    const at::Tensor x = x0.clone().requires_grad_();
    const at::Tensor y = tiled_compute(mlp, x, w, /*dim=*/1, tiles);
    EXPECT_TRUE(at::allclose(y, ref, 0, 1e-14));
    y.backward(g);
    EXPECT_TRUE(at::allclose(x.grad(), rx.grad(), 0, 1e-13));
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_TRUE(at::allclose(w[i].grad(), ref_w[i].grad(), 0, 1e-12)) << "parameter " << i;
    // (more tiles than positions: the function runs whole, without the tiled node)
    EXPECT_EQ(calls, 3) << "each parameter's gradient arrives once, whole";
  }
}

TEST(TiledCompute, AParameterWithoutGradientGetsNone) {
  auto w = weights();
  w[1] = w[1].detach();
  const at::Tensor x = at::randn({1, 8, 6}, at::kDouble).requires_grad_();
  tiled_compute(mlp, x, w, 1, 4).sum().backward();
  EXPECT_TRUE(w[0].grad().defined());
  EXPECT_FALSE(w[1].grad().defined());
}

TEST(TiledCompute, RefusesTheSplitBackward) {
  auto w = weights();
  const at::Tensor x = at::randn({1, 8, 6}, at::kDouble).requires_grad_();
  const at::Tensor y = tiled_compute(mlp, x, w, 1, 4);
  dscpp::ops::DeferredGrads deferred;
  dscpp::ops::DeferGrads scope(deferred);
  EXPECT_THROW(y.sum().backward(), std::exception);
}

}  // namespace
