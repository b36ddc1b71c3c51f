// bias_gelu on the ATen path (CPU): its output and both gradients against torch's own
// gelu(x + bias) in float64, a finite-difference check of its autograd wiring, the saved bias
// following a set_data swap (ZeRO stage 3), the dtypes it promotes, the arguments it refuses.
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/ops/fused_ops.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::bias_gelu;
using dscpp::ops::test::max_gradient_error;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

const char* approximate(bool tanh) {
  return tanh ? "tanh" : "none";
}

TEST(BiasGelu, MatchesTorchGeluOfSumInFloat64) {
  at::manual_seed(1);
  for (bool tanh : {false, true}) {
    SCOPED_TRACE(approximate(tanh));
    const at::Tensor x0 = randn64({3, 5, 7}, 2.0), b0 = randn64({7});
    const at::Tensor x = x0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const at::Tensor rx = x0.clone().requires_grad_(), rb = b0.clone().requires_grad_();
    const at::Tensor y = bias_gelu(x, b, tanh);
    const at::Tensor ref = at::gelu(rx.add(rb), approximate(tanh));
    ASSERT_EQ(y.sizes(), ref.sizes());
    ASSERT_EQ(y.scalar_type(), at::kDouble);
    EXPECT_LT(rel_err(y, ref), 1e-14);
    const at::Tensor g = randn64({3, 5, 7});
    y.backward(g);
    ref.backward(g);
    EXPECT_LT(rel_err(x.grad(), rx.grad()), 1e-14) << "dx";
    EXPECT_LT(rel_err(b.grad(), rb.grad()), 1e-14) << "dbias";
  }
}

TEST(BiasGelu, GradientsMatchFiniteDifferences) {
  at::manual_seed(2);
  for (bool tanh : {false, true}) {
    SCOPED_TRACE(approximate(tanh));
    const at::Tensor x = randn64({4, 6}, 2.0).requires_grad_();
    const at::Tensor b = randn64({6}).requires_grad_();
    const auto f = [tanh](const std::vector<at::Tensor>& in) {
      return bias_gelu(in[0], in[1], tanh);
    };
    EXPECT_LT(max_gradient_error(f, {x, b}, randn64({4, 6})), 1e-8);
  }
}

// Only bias needs a gradient: dbias still comes (dx is not computed).
TEST(BiasGelu, GivesDbiasWhenXNeedsNoGradient) {
  at::manual_seed(3);
  const at::Tensor x = randn64({5, 3});
  const at::Tensor b = randn64({3}).requires_grad_();
  const at::Tensor rb = b.detach().clone().requires_grad_();
  const at::Tensor g = randn64({5, 3});
  bias_gelu(x, b, false).backward(g);
  at::gelu(x.add(rb)).backward(g);
  EXPECT_LT(rel_err(b.grad(), rb.grad()), 1e-14);
}

// ZeRO stage 3 releases a parameter after forward (set_data to an empty tensor) and gathers
// it before backward (set_data to the full values). Backward must read the bias as it is
// then: the saved bias is the parameter itself, not a copy or view taken at forward time.
TEST(BiasGelu, BackwardReadsTheBiasAsSetDataLeftIt) {
  at::manual_seed(4);
  const at::Tensor x = randn64({4, 3}, 2.0).requires_grad_();
  const at::Tensor bias = randn64({3}).requires_grad_();
  const at::Tensor gathered = randn64({3});
  const at::Tensor y = bias_gelu(x, bias, false);
  {
    const c10::NoGradGuard no_grad;
    bias.set_data(at::empty({0}, bias.options()));  // released
    bias.set_data(gathered.clone());                // gathered again, other values
  }
  const at::Tensor g = randn64({4, 3});
  y.backward(g);
  const at::Tensor rx = x.detach().clone().requires_grad_();
  at::gelu(rx.add(gathered)).backward(g);
  EXPECT_LT(rel_err(x.grad(), rx.grad()), 1e-14) << "dx uses the bias of backward time";

  // A bias still released at backward time is an error that says so.
  const at::Tensor y2 = bias_gelu(x, bias, false);
  {
    const c10::NoGradGuard no_grad;
    bias.set_data(at::empty({0}, bias.options()));
  }
  try {
    y2.backward(g);
    ADD_FAILURE() << "backward with a released bias did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZeRO"), std::string::npos) << e.what();
  }
}

// Off the kernels' dtypes the op is torch's composition, promotion included.
TEST(BiasGelu, PromotesMixedDtypesAsTorchDoes) {
  at::manual_seed(5);
  const at::Tensor x = randn64({6, 4}).to(at::kBFloat16).requires_grad_();
  const at::Tensor b = randn64({4}).to(at::kFloat).requires_grad_();
  const at::Tensor rx = x.detach().clone().requires_grad_();
  const at::Tensor rb = b.detach().clone().requires_grad_();
  const at::Tensor y = bias_gelu(x, b, true);
  const at::Tensor ref = at::gelu(rx.add(rb), "tanh");
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_TRUE(y.equal(ref));
  const at::Tensor g = randn64({6, 4}).to(at::kFloat);
  y.backward(g);
  ref.backward(g);
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(b.grad().scalar_type(), at::kFloat);
  EXPECT_TRUE(x.grad().equal(rx.grad()));
  EXPECT_LT(rel_err(b.grad(), rb.grad()), 1e-6);
}

TEST(BiasGelu, RefusesArgumentsItCannotTake) {
  const at::Tensor x = randn64({2, 3});
  EXPECT_THROW(bias_gelu(x, randn64({4}), false), c10::Error);     // n differs
  EXPECT_THROW(bias_gelu(x, randn64({1, 3}), false), c10::Error);  // bias not 1-d
  EXPECT_THROW(bias_gelu(x.to(at::kLong), randn64({3}).to(at::kLong), false), c10::Error);
  EXPECT_THROW(bias_gelu(x, at::Tensor(), false), c10::Error);
}

}  // namespace
