// tiled_cross_entropy against torch's cross entropy of the whole logits x · Wᵀ: the loss and
// the gradients of x and W in float64 (tiles that divide the rows and that do not, ignored
// rows, one tile, more tiles than rows), bf16 x and W against the untiled bf16 head and fp32
// loss, the arguments it refuses.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "dscpp/error.h"
#include "dscpp/ops/tiled_cross_entropy.h"

namespace {

using dscpp::ops::tiled_cross_entropy;

struct Grads {
  at::Tensor loss, dx, dw;
};

Grads tiled(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& t, int64_t tiles) {
  const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const at::Tensor loss = tiled_cross_entropy(x, w, t, tiles);
  loss.mul(1.7).backward();
  return {loss.detach(), x.grad(), w.grad()};
}

// The whole logits, as the GPT's head and loss form them: x · Wᵀ in x's dtype, the loss in fp32.
Grads whole(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& t) {
  const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const at::ScalarType type = x0.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor loss = at::cross_entropy_loss(at::mm(x, w.t()).to(type), t);
  loss.mul(1.7).backward();
  return {loss.detach(), x.grad(), w.grad()};
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() /
          b.to(at::kDouble).abs().max().clamp_min(1e-300))
      .item<double>();
}

TEST(TiledCrossEntropy, MatchesTheWholeLogitsInFloat64) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({37, 16}, at::kDouble), w = at::randn({50, 16}, at::kDouble);
  at::Tensor t = at::randint(0, 50, {37}, at::kLong);
  t.index_put_({at::tensor({2, 11, 30}, at::kLong)}, -100);  // left out
  const Grads ref = whole(x, w, t);
  for (int64_t tiles : {1, 2, 5, 37, 100}) {
    SCOPED_TRACE(tiles);
    const Grads got = tiled(x, w, t, tiles);
    EXPECT_LT(rel(got.loss, ref.loss), 1e-14);
    EXPECT_LT(rel(got.dx, ref.dx), 1e-13);
    EXPECT_LT(rel(got.dw, ref.dw), 1e-13);
    EXPECT_TRUE(got.dx.index({2}).eq(0).all().item<bool>()) << "an ignored row has no gradient";
  }
}

TEST(TiledCrossEntropy, SixteenBitMatchesTheUntiledHead) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({64, 32}).to(at::kBFloat16);
  const at::Tensor w = (at::randn({96, 32}) * 0.2).to(at::kBFloat16);
  const at::Tensor t = at::randint(0, 96, {64}, at::kLong);
  const Grads ref = whole(x, w, t), got = tiled(x, w, t, 4);
  EXPECT_EQ(got.loss.scalar_type(), at::kFloat);
  EXPECT_LT(rel(got.loss, ref.loss), 1e-6);
  EXPECT_EQ(got.dx.scalar_type(), at::kBFloat16);
  EXPECT_LT(rel(got.dx, ref.dx), 1e-2);  // (bf16 rounding of the same products)
  EXPECT_LT(rel(got.dw, ref.dw), 1e-2);
}

TEST(TiledCrossEntropy, RefusesArgumentsItCannotTake) {
  const at::Tensor x = at::randn({4, 8}), w = at::randn({10, 8});
  const at::Tensor t = at::zeros({4}, at::kLong);
  EXPECT_THROW(tiled_cross_entropy(x, w, t, 0), dscpp::Error);
  EXPECT_THROW(tiled_cross_entropy(x, at::randn({10, 7}), t, 2), dscpp::Error);
  EXPECT_THROW(tiled_cross_entropy(x, w, at::zeros({5}, at::kLong), 2), dscpp::Error);
}

}  // namespace
