// The split backward's store (ops/deferred_grads.h) with ZeRO's hooks (zero/grad_hooks.h): inside
// a DeferGrads scope, nn::linear's weight products and every other gradient a parameter receives
// are put off; no parameter's gradient and no ready hook is seen until run(), which gives every
// parameter autograd's gradient, bit for bit, and runs each ready hook once.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "dscpp/error.h"
#include "dscpp/nn/linear.h"
#include "dscpp/ops/deferred_grads.h"
#include "dscpp/zero/grad_hooks.h"

namespace {

// w1 and b1 through nn::linear, w2 without bias; w1 also used outside a linear (as a tied
// weight is), so its gradient is a put-off product plus a gradient computed in B; c only
// outside a linear.
struct Net {
  at::Tensor w1, b1, w2, c;
  std::vector<at::Tensor> params() const { return {w1, b1, w2, c}; }
  at::Tensor loss(const at::Tensor& x) const {
    at::Tensor h = at::tanh(dscpp::nn::linear(x, w1, b1)) * c;
    return dscpp::nn::linear(h, w2).pow(2).mean() + 0.01 * (w1 * w1).sum();
  }
};

Net make_net() {
  auto gen = at::detail::createCPUGenerator(5);
  auto draw = [&](at::IntArrayRef s) { return at::randn(s, gen).mul(0.3); };
  Net n{draw({16, 12}), draw({16}), draw({8, 16}), draw({16})};
  for (auto& p : n.params()) p.set_requires_grad(true);
  return n;
}

TEST(DeferredGrads, PutOffUntilRunThenAutogradsGradients) {
  const at::Tensor x = at::randn({6, 12}, at::detail::createCPUGenerator(6));
  Net ref = make_net();
  ref.loss(x).backward();

  Net net = make_net();
  std::vector<int> ready(4, 0);
  auto hooks = dscpp::zero::register_ready_hooks(net.params(), [&](int i) { ++ready[i]; });
  dscpp::ops::DeferredGrads deferred;
  {
    dscpp::ops::DeferGrads scope(deferred);
    EXPECT_TRUE(dscpp::ops::capturing());
    torch::autograd::backward({net.loss(x)});
  }
  EXPECT_FALSE(dscpp::ops::capturing());
  for (const auto& p : net.params()) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(ready, std::vector<int>(4, 0));
  // w1 and w2 split (their products put off); b1 and c only have gradients computed in B.
  EXPECT_EQ(deferred.split_params(), 2);
  EXPECT_EQ(deferred.unsplit_params(), 2);
  EXPECT_TRUE(deferred.unsplit_matrices().empty());

  deferred.run();
  EXPECT_TRUE(deferred.empty());
  EXPECT_EQ(ready, std::vector<int>(4, 1));
  const auto got = net.params(), want = ref.params();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(at::equal(got[i].grad(), want[i].grad())) << "parameter " << i;

  // A second backward accumulates, as autograd does.
  {
    dscpp::ops::DeferGrads scope(deferred);
    torch::autograd::backward({net.loss(x)});
  }
  deferred.run();
  ref.loss(x).backward();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(at::equal(got[i].grad(), want[i].grad())) << "parameter " << i;
  EXPECT_EQ(ready, std::vector<int>(4, 2));
}

TEST(DeferredGrads, ScopesDoNotNestAndNothingIsPutOffWithoutOne) {
  Net net = make_net();
  EXPECT_FALSE(dscpp::ops::defer_weight_grad(net.w1, [] { return at::Tensor(); }));
  dscpp::ops::DeferredGrads a, b;
  dscpp::ops::DeferGrads scope(a);
  EXPECT_THROW(dscpp::ops::DeferGrads nested(b), dscpp::Error);
  EXPECT_THROW(a.run(), dscpp::Error);
  // A tensor that is not a leaf needing a gradient is never put off.
  EXPECT_FALSE(dscpp::ops::defer_weight_grad(net.w1 * 2, [] { return at::Tensor(); }));
  EXPECT_FALSE(dscpp::ops::defer_weight_grad(at::zeros({2}), [] { return at::Tensor(); }));
  EXPECT_TRUE(dscpp::ops::defer_weight_grad(net.w1, [] { return at::Tensor(); }));
  EXPECT_EQ(a.split_params(), 1);
}

}  // namespace
