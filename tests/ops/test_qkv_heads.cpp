// qkv_heads against the eager composition it replaces (view, permute, unbind) in float64:
// the same three views (values and strides), and the same gradient of the projection output
// when each of q, k, v or only some of them feed the loss; bad shapes refused.
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include "dscpp/ops/fused_ops.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::qkv_heads;
using dscpp::ops::test::randn64;

TEST(QkvHeads, ViewsAndGradientMatchTheEagerComposition) {
  at::manual_seed(3);
  const int64_t batch = 2, seq = 5, heads = 3, dim = 4, hidden = heads * dim;
  const at::Tensor x0 = randn64({batch, seq, 3 * hidden});
  // Weights per output so that a mixed-up q/k/v or head order changes the gradient.
  const at::Tensor wq = randn64({batch, heads, seq, dim}), wk = randn64({batch, heads, seq, dim}),
                   wv = randn64({batch, heads, seq, dim});
  for (int used : {7, 1, 2, 4, 5}) {  // bit i: output i feeds the loss
    SCOPED_TRACE(used);
    const at::Tensor x = x0.clone().requires_grad_(), rx = x0.clone().requires_grad_();
    const auto got = qkv_heads(x, heads);
    const auto ref = rx.view({batch, seq, 3, heads, dim}).permute({2, 0, 3, 1, 4}).unbind(0);
    const at::Tensor w[3] = {wq, wk, wv};
    at::Tensor loss = at::zeros({}, x0.options()), rloss = at::zeros({}, x0.options());
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(got[i].sizes(), ref[i].sizes());
      EXPECT_EQ(got[i].strides(), ref[i].strides());  // a view of x, not a copy
      EXPECT_TRUE(got[i].storage().is_alias_of(x.storage()));
      EXPECT_EQ(got[i].storage_offset(), ref[i].storage_offset());
      EXPECT_TRUE(got[i].equal(ref[i]));
      if (used & (1 << i)) {
        loss = at::add(loss, at::sum(at::mul(got[i], w[i])));
        rloss = at::add(rloss, at::sum(at::mul(ref[i], w[i])));
      }
    }
    loss.backward();
    rloss.backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_TRUE(x.grad().is_contiguous());
    EXPECT_TRUE(x.grad().allclose(rx.grad(), 0, 0));  // copies only: bit-equal
  }
}

TEST(QkvHeads, RefusesShapesThatDoNotSplit) {
  EXPECT_THROW(qkv_heads(randn64({2, 5, 12}), 5), c10::Error);  // 12 is not 3 * 5 * d
  EXPECT_THROW(qkv_heads(randn64({10, 12}), 2), c10::Error);    // not [B, S, 3h]
}

}  // namespace
