// swiglu on the ATen path (CPU): its output and gradient against torch's own silu(gate) * up
// over the two halves in float64, a finite-difference check of its autograd wiring, the
// shapes it keeps, and the inputs it refuses.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <vector>

#include "dscpp/ops/fused_ops.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::swiglu;
using dscpp::ops::test::max_gradient_error;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

TEST(Swiglu, MatchesSiluOfGateTimesUpInFloat64) {
  at::manual_seed(31);
  const at::Tensor x0 = randn64({3, 5, 14}, 2.0);
  const at::Tensor x = x0.clone().requires_grad_(), rx = x0.clone().requires_grad_();
  const at::Tensor y = swiglu(x);
  const auto halves = rx.chunk(2, -1);
  const at::Tensor ref = at::silu(halves[0]) * halves[1];
  ASSERT_EQ(y.sizes(), at::IntArrayRef({3, 5, 7}));
  ASSERT_EQ(y.scalar_type(), at::kDouble);
  EXPECT_LT(rel_err(y, ref), 1e-15);
  const at::Tensor g = randn64({3, 5, 7});
  y.backward(g);
  ref.backward(g);
  ASSERT_EQ(x.grad().sizes(), x.sizes());
  EXPECT_LT(rel_err(x.grad(), rx.grad()), 1e-14);
}

TEST(Swiglu, GradientMatchesFiniteDifferences) {
  at::manual_seed(32);
  const at::Tensor x = randn64({4, 10}, 2.0).requires_grad_();
  const auto f = [](const std::vector<at::Tensor>& in) { return swiglu(in[0]); };
  EXPECT_LT(max_gradient_error(f, {x}, randn64({4, 5})), 1e-8);
}

TEST(Swiglu, FloatInputKeepsItsDtype) {
  const at::Tensor x = randn64({2, 8}).to(at::kFloat);
  EXPECT_EQ(swiglu(x).scalar_type(), at::kFloat);
  EXPECT_EQ(swiglu(x.narrow(-1, 0, 4)).sizes(), at::IntArrayRef({2, 2}));  // a strided input
}

TEST(Swiglu, RefusesAnOddLastDimension) {
  EXPECT_THROW(swiglu(randn64({2, 7})), c10::Error);
  EXPECT_THROW(swiglu(at::Tensor()), c10::Error);
  EXPECT_THROW(swiglu(randn64({2, 8}).to(at::kLong)), c10::Error);
}

}  // namespace
