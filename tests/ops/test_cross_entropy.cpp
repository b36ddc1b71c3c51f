// cross_entropy on the ATen path (CPU): the loss and its gradient against torch's
// cross_entropy_loss in float64 (ignored rows, another ignore_index, every row ignored), a
// finite-difference check of its autograd wiring, 16-bit logits against torch's fp32 loss,
// the arguments it refuses.
#include <ATen/core/Reduction.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "dscpp/ops/fused_ops.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::cross_entropy;
using dscpp::ops::test::max_gradient_error;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

at::Tensor targets_of(std::vector<int64_t> v) {
  return at::tensor(v, at::kLong);
}

// Our loss and dlogits against torch's for the same float64 logits and targets.
void expect_matches_torch(const at::Tensor& logits0, const at::Tensor& targets,
                          int64_t ignore_index, double grad_out) {
  const at::Tensor x = logits0.clone().requires_grad_();
  const at::Tensor rx = logits0.clone().requires_grad_();
  const at::Tensor loss = cross_entropy(x, targets, ignore_index);
  const at::Tensor ref = at::cross_entropy_loss(rx, targets, {}, at::Reduction::Mean, ignore_index);
  ASSERT_EQ(loss.dim(), 0);
  ASSERT_EQ(loss.scalar_type(), at::kDouble);
  EXPECT_LT(rel_err(loss, ref), 1e-14);
  loss.mul(grad_out).backward();
  ref.mul(grad_out).backward();
  EXPECT_LT(rel_err(x.grad(), rx.grad()), 1e-14) << "dlogits";
}

TEST(CrossEntropy, MatchesTorchInFloat64WithIgnoredRows) {
  at::manual_seed(11);
  const at::Tensor logits = randn64({7, 11}, 3.0);
  expect_matches_torch(logits, targets_of({3, -100, 0, 10, -100, 5, 5}), -100, 1.0);
  expect_matches_torch(logits, targets_of({3, 1, 0, 10, 2, 5, 5}), -100, 0.37);
  // ignore_index may be a class: rows of class 5 do not count.
  expect_matches_torch(logits, targets_of({3, 1, 0, 10, 2, 5, 5}), 5, 2.0);
  expect_matches_torch(randn64({1, 1}), targets_of({0}), -100, 1.0);
}

// torch: 0 / 0 = NaN for the loss, zero gradients.
TEST(CrossEntropy, EveryRowIgnoredGivesNaNAndZeroGradient) {
  const at::Tensor x = randn64({3, 4}).requires_grad_();
  const at::Tensor loss = cross_entropy(x, targets_of({-100, -100, -100}));
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_EQ(x.grad().abs().max().item<double>(), 0.0);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  at::manual_seed(12);
  const at::Tensor x = randn64({5, 4}, 2.0).requires_grad_();
  const at::Tensor t = targets_of({1, -100, 3, 0, 3});
  const auto f = [&t](const std::vector<at::Tensor>& in) { return cross_entropy(in[0], t); };
  EXPECT_LT(max_gradient_error(f, {x}, randn64({})), 1e-9);
}

// bf16 logits: the loss is fp32 and equals torch's on the logits made fp32 (what GPT::loss
// did), the gradient is bf16.
TEST(CrossEntropy, SixteenBitLogitsMatchTorchOnFloat32) {
  at::manual_seed(13);
  const at::Tensor logits = randn64({9, 33}, 3.0).to(at::kBFloat16);
  const at::Tensor t = at::randint(33, {9}, at::kLong);
  t[4] = -100;
  const at::Tensor x = logits.clone().requires_grad_();
  const at::Tensor rx = logits.clone().requires_grad_();
  const at::Tensor loss = cross_entropy(x, t);
  const at::Tensor ref = at::cross_entropy_loss(rx.to(at::kFloat), t);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_LT(rel_err(loss, ref), 1e-6);
  loss.backward();
  ref.backward();
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_LT(rel_err(x.grad(), rx.grad()), 1e-2);
}

TEST(CrossEntropy, RefusesArgumentsItCannotTake) {
  const at::Tensor x = randn64({3, 4});
  EXPECT_THROW(cross_entropy(x, targets_of({0, 1})), c10::Error);      // N differs
  EXPECT_THROW(cross_entropy(x, targets_of({0, 1, 4})), c10::Error);   // class 4 of 4
  EXPECT_THROW(cross_entropy(x, targets_of({0, -1, 2})), c10::Error);  // negative
  EXPECT_THROW(cross_entropy(x, targets_of({0, 1, 2}).to(at::kInt)), c10::Error);
  EXPECT_THROW(cross_entropy(x.view({12}), targets_of({0})), c10::Error);  // not [N, V]
  EXPECT_THROW(cross_entropy(randn64({3, 0}), targets_of({0, 0, 0})), c10::Error);
}

}  // namespace
