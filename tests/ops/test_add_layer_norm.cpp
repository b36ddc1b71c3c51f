// add_layer_norm on the ATen path (CPU): h and y and the three gradients against the formulas
// in float64 (tests/ops/add_layer_norm_reference.h) for float64, fp32 and bf16 inputs; a
// finite-difference check of the autograd wiring; h or y unused; the saved weight following a
// set_data swap (ZeRO stage 3); the arguments it refuses.
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/ops/fused_ops.h"
#include "tests/ops/add_layer_norm_reference.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::add_layer_norm;
using dscpp::ops::test::add_layer_norm_reference;
using dscpp::ops::test::max_gradient_error;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

struct Leaves {
  at::Tensor x, branch, weight, bias;
};

Leaves leaves(at::IntArrayRef shape, at::ScalarType dtype) {
  const int64_t n = shape.back();
  return {randn64(shape, 2.0).to(dtype).requires_grad_(), randn64(shape).to(dtype).requires_grad_(),
          randn64({n}, 0.5).add_(1.0).to(dtype).requires_grad_(),
          randn64({n}, 0.5).to(dtype).requires_grad_()};
}

TEST(AddLayerNorm, MatchesFloat64FormulasAtEachDtype) {
  at::manual_seed(31);
  struct Case {
    at::ScalarType dtype;
    double tol;
  };
  for (const Case c : {Case{at::kDouble, 1e-12}, Case{at::kFloat, 1e-5}, Case{at::kBFloat16, 1e-2}})
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 3}, {3, 5, 7}, {9, 130}, {2, 3, 1001}}) {
      SCOPED_TRACE(fmt::format("{} n={}", c10::toString(c.dtype), shape.back()));
      const Leaves l = leaves(shape, c.dtype);
      const double eps = 1e-5;
      auto [h, y] = add_layer_norm(l.x, l.branch, l.weight, l.bias, eps);
      ASSERT_EQ(h.scalar_type(), c.dtype);
      ASSERT_EQ(y.sizes(), l.x.sizes());
      // h is x + branch rounded once to the dtype.
      EXPECT_TRUE(
          h.equal(l.x.detach().to(at::kDouble).add(l.branch.detach().to(at::kDouble)).to(c.dtype)));
      const at::Tensor dh = randn64(shape).to(c.dtype), dy = randn64(shape).to(c.dtype);
      // d/dh and d/dy of sum(h * dh + y * dy) are exactly dh and dy.
      h.mul(dh).sum().add(y.mul(dy).sum()).backward();
      const auto ref = add_layer_norm_reference(h, l.weight, l.bias, eps, dh, dy);
      EXPECT_LT(rel_err(y, ref.y), c.tol) << "y";
      EXPECT_LT(rel_err(l.x.grad(), ref.dx), c.tol) << "dx";
      EXPECT_TRUE(l.branch.grad().equal(l.x.grad())) << "x and branch share dx";
      EXPECT_LT(rel_err(l.weight.grad(), ref.dweight), c.tol) << "dweight";
      EXPECT_LT(rel_err(l.bias.grad(), ref.dbias), c.tol) << "dbias";
    }
}

TEST(AddLayerNorm, GradientsMatchFiniteDifferences) {
  at::manual_seed(32);
  const Leaves l = leaves({4, 6}, at::kDouble);
  const at::Tensor wh = randn64({4, 6}), wy = randn64({4, 6});
  // Both outputs weighted: sum(h * wh + y * wy) through one output of the same shape.
  const auto f = [&](const std::vector<at::Tensor>& in) {
    auto [h, y] = add_layer_norm(in[0], in[1], in[2], in[3], 1e-5);
    return h.mul(wh).add(y.mul(wy));
  };
  EXPECT_LT(max_gradient_error(f, {l.x, l.branch, l.weight, l.bias}, at::ones({4, 6}, at::kDouble)),
            1e-7);
}

// Only y used (h's gradient undefined), then only h (y's undefined: dx = dh, zero dweight).
TEST(AddLayerNorm, EitherOutputMayBeUnused) {
  at::manual_seed(33);
  const double eps = 1e-6;
  {
    const Leaves l = leaves({5, 12}, at::kDouble);
    auto [h, y] = add_layer_norm(l.x, l.branch, l.weight, l.bias, eps);
    const at::Tensor dy = randn64({5, 12});
    y.backward(dy);
    const auto ref = add_layer_norm_reference(h, l.weight, l.bias, eps, at::Tensor(), dy);
    EXPECT_LT(rel_err(l.x.grad(), ref.dx), 1e-12);
    EXPECT_LT(rel_err(l.weight.grad(), ref.dweight), 1e-12);
  }
  {
    const Leaves l = leaves({5, 12}, at::kDouble);
    auto [h, y] = add_layer_norm(l.x, l.branch, l.weight, l.bias, eps);
    const at::Tensor dh = randn64({5, 12});
    h.backward(dh);
    EXPECT_TRUE(l.x.grad().equal(dh));
    EXPECT_TRUE(l.branch.grad().equal(dh));
    // y took no part in the loss: its parameters' gradients are zero or absent.
    if (l.weight.grad().defined()) {
      EXPECT_EQ(l.weight.grad().abs().sum().item<double>(), 0.0);
    }
  }
}

// A weight released and re-gathered (set_data, as ZeRO stage 3 does) between forward and
// backward is read as it is at backward time.
TEST(AddLayerNorm, BackwardReadsTheWeightAsSetDataLeftIt) {
  at::manual_seed(34);
  const Leaves l = leaves({6, 16}, at::kDouble);
  const at::Tensor gathered = randn64({16});
  auto [h, y] = add_layer_norm(l.x, l.branch, l.weight, l.bias, 1e-5);
  {
    const c10::NoGradGuard no_grad;
    l.weight.set_data(at::empty({0}, l.weight.options()));
    l.weight.set_data(gathered.clone());
  }
  const at::Tensor dy = randn64({6, 16});
  y.backward(dy);
  const auto ref = add_layer_norm_reference(h, gathered, l.bias, 1e-5, at::Tensor(), dy);
  EXPECT_LT(rel_err(l.x.grad(), ref.dx), 1e-12);
}

TEST(AddLayerNorm, RefusesMismatchedArguments) {
  const at::Tensor x = at::zeros({2, 8}), w = at::zeros({8});
  const auto message = [](const auto& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              add_layer_norm(x, at::zeros({2, 7}), w, w, 1e-5);
            }).find("branch is"),
            std::string::npos);
  EXPECT_NE(message([&] { add_layer_norm(x, x, at::zeros({7}), w, 1e-5); }).find("weight [n]"),
            std::string::npos);
  EXPECT_NE(message([&] { add_layer_norm(x, x, at::empty({0}), w, 1e-5); }).find("ZeRO stage-3"),
            std::string::npos);
}

}  // namespace
