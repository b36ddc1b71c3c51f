// FP8's delayed scaling (nn/fp8_meta.h): the scales each step casts with come from the amax
// history of the steps before it, as Transformer Engine's DelayedScaling defines them, checked
// against a history kept by hand and float64 products of operands quantised by those scales.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/fp8_meta.h"
#include "dscpp/nn/linear.h"
#include "dscpp/ops/fp8.h"

namespace fp8 = dscpp::ops::fp8;
namespace nn = dscpp::nn;

namespace {

// The factor a scale is: max / amax, in float64 then fp32 (scale 1 before any amax).
float factor_of(double amax, fp8::Format f) {
  return static_cast<float>(fp8::max_finite(f) / amax);
}

// x cast as the delayed recipe casts it (x · factor in fp32, saturated, rounded to the format),
// back in float64.
at::Tensor quantised(const at::Tensor& x, float factor, fp8::Format f) {
  const double m = fp8::max_finite(f);
  const at::Tensor q = (x.to(at::kFloat) * factor).clamp(-m, m).to(fp8::dtype(f));
  return q.to(at::kDouble) * static_cast<double>(1.0f / factor);
}

double max_rel_diff(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

nn::Fp8Recipe delayed(int history, nn::Fp8AmaxAlgo algo) {
  nn::Fp8Recipe r;
  r.hybrid = true;
  r.scaling = nn::Fp8Scaling::Delayed;
  r.amax_history_len = history;
  r.amax_compute_algo = algo;
  return r;
}

// A module holding one Fp8Meta, as a transformer block does.
struct Holder : torch::nn::Module {
  Holder(int64_t products, const nn::Fp8Recipe& r)
      : meta(register_module("fp8_meta", nn::Fp8Meta(products, r))) {}
  nn::Fp8Meta meta;
};

// One operand's history as Transformer Engine keeps it, by hand: the amax of the step, then
// the scale from the window (the newest len amaxes, this step's among them) or the newest.
struct HandHistory {
  int len;
  bool max_algo;
  fp8::Format format;
  std::deque<double> window;  // newest last
  float factor = 1.0f;
  void step(double amax) {
    window.push_back(amax);
    while (static_cast<int>(window.size()) > len) window.pop_front();
    const double a = max_algo ? *std::max_element(window.begin(), window.end()) : amax;
    if (std::isfinite(a) && a > 0) factor = factor_of(a, format);
  }
};

}  // namespace

// Four steps of y = x·Wᵀ whose inputs change in size (x: ×1, ×8, ×0.25, ×2; the output
// gradient: ×1, ×0.5, ×16, ×1): each step casts with the scales the steps before it set, so a
// step whose x grew eightfold saturates, which the reference, quantising by the same scales,
// does too. Both algorithms, history lengths 1 and 3.
TEST(Fp8Delayed, EachStepCastsWithTheScalesOfTheHistoryBeforeIt) {
  for (const auto& [len, algo] :
       std::vector<std::pair<int, nn::Fp8AmaxAlgo>>{{1, nn::Fp8AmaxAlgo::MostRecent},
                                                    {3, nn::Fp8AmaxAlgo::Max},
                                                    {3, nn::Fp8AmaxAlgo::MostRecent}}) {
    SCOPED_TRACE("history " + std::to_string(len) +
                 (algo == nn::Fp8AmaxAlgo::Max ? ", max" : ", most_recent"));
    const nn::Fp8Recipe r = delayed(len, algo);
    Holder holder(1, r);
    const bool max_algo = algo == nn::Fp8AmaxAlgo::Max;
    HandHistory hx{len, max_algo, fp8::Format::E4M3, {}}, hw{len, max_algo, fp8::Format::E4M3, {}},
        hg{len, max_algo, fp8::Format::E5M2, {}};
    at::manual_seed(3);
    const at::Tensor w0 = at::randn({32, 48}) * 0.2;
    const std::vector<double> x_gain = {1, 8, 0.25, 2}, g_gain = {1, 0.5, 16, 1};
    for (size_t k = 0; k < x_gain.size(); ++k) {
      SCOPED_TRACE("step " + std::to_string(k));
      const at::Tensor x0 = at::randn({16, 48}) * x_gain[k];
      const at::Tensor dy = at::randn({16, 32}) * g_gain[k];
      at::Tensor x = x0.clone().requires_grad_(true);
      at::Tensor w = w0.clone().requires_grad_(true);
      {
        nn::Fp8Autocast scope(r, holder.meta.ptr().get());
        at::Tensor y = nn::linear(x, w, at::Tensor());
        // The forward product by the scales in force (this step's amaxes not yet used).
        const at::Tensor qx = quantised(x0, hx.factor, fp8::Format::E4M3);
        const at::Tensor qw = quantised(w0, hw.factor, fp8::Format::E4M3);
        EXPECT_LT(max_rel_diff(y, at::matmul(qx, qw.t())), 1e-6);
        y.backward(dy);
        const at::Tensor qg = quantised(dy, hg.factor, fp8::Format::E5M2);
        EXPECT_LT(max_rel_diff(x.grad(), at::matmul(qg, qw)), 1e-6);
        EXPECT_LT(max_rel_diff(w.grad(), at::matmul(qg.t(), qx)), 1e-6);
      }
      // This step's amaxes in row 0 (x, W, dy), then the update.
      const at::Tensor row0 = holder.meta->amax_history[0];
      EXPECT_EQ(row0[0].item<float>(), x0.abs().max().item<float>());
      EXPECT_EQ(row0[1].item<float>(), w0.abs().max().item<float>());
      EXPECT_EQ(row0[2].item<float>(), dy.abs().max().item<float>());
      nn::update_fp8_metas(holder, nullptr);
      hx.step(x0.abs().max().item<float>());
      hw.step(w0.abs().max().item<float>());
      hg.step(dy.abs().max().item<float>());
      EXPECT_EQ(holder.meta->scale[0].item<float>(), hx.factor);
      EXPECT_EQ(holder.meta->scale[1].item<float>(), hw.factor);
      EXPECT_EQ(holder.meta->scale[2].item<float>(), hg.factor);
      // Rolled: row 0 starts over; the newest amax is the last row.
      EXPECT_EQ(holder.meta->amax_history[0].abs().sum().item<float>(), 0.0f);
      if (len > 1) {
        EXPECT_EQ(holder.meta->amax_history[len - 1][0].item<float>(),
                  x0.abs().max().item<float>());
      }
    }
  }
}

// Transformer Engine's roll of a history of 3: [a0, a1, a2] -> [0, a2, a0] (the oldest, a1,
// drops out), and a step without an amax (a product not made) keeps its scale.
TEST(Fp8Delayed, TheHistoryRollsAsTransformerEnginesAndAnEmptyStepKeepsTheScale) {
  Holder holder(2, delayed(3, nn::Fp8AmaxAlgo::Max));
  at::Tensor h = holder.meta->amax_history;
  h.copy_(at::tensor({1.f, 0.f, 0.f, 0.f, 0.f, 0.f,   // row 0: this step's (slot 0, x only)
                      5.f, 0.f, 0.f, 0.f, 0.f, 0.f,   // row 1: the oldest
                      2.f, 0.f, 0.f, 0.f, 0.f, 0.f})  // row 2: the newest before this step
              .view({3, 6}));
  nn::update_fp8_metas(holder, nullptr);
  EXPECT_EQ(h[0][0].item<float>(), 0.0f);
  EXPECT_EQ(h[1][0].item<float>(), 2.0f);
  EXPECT_EQ(h[2][0].item<float>(), 1.0f);
  EXPECT_EQ(holder.meta->scale[0].item<float>(), factor_of(5.0, fp8::Format::E4M3));
  // Slot 1 made no product: amax 0 everywhere, its scales stay 1.
  for (int c = 3; c < 6; ++c) EXPECT_EQ(holder.meta->scale[c].item<float>(), 1.0f);
  // An infinite amax keeps the scale too.
  h[0][0].fill_(INFINITY);
  nn::update_fp8_metas(holder, nullptr);
  EXPECT_EQ(holder.meta->scale[0].item<float>(), factor_of(5.0, fp8::Format::E4M3));
}

// The ranks' reduction takes every meta's row 0 at once and its maximum is what sets the
// scales: a rank whose own amax was smaller casts with the larger one (so every data rank
// casts alike).
TEST(Fp8Delayed, TheScalesFollowTheReducedAmaxOfAllRanks) {
  struct Two : torch::nn::Module {
    explicit Two(const nn::Fp8Recipe& r)
        : a(register_module("a", std::make_shared<Holder>(1, r))),
          b(register_module("b", std::make_shared<Holder>(1, r))) {}
    std::shared_ptr<Holder> a, b;
  } two(delayed(1, nn::Fp8AmaxAlgo::MostRecent));
  two.a->meta->amax_history[0].copy_(at::tensor({1.f, 2.f, 3.f}));
  two.b->meta->amax_history[0].copy_(at::tensor({4.f, 5.f, 6.f}));
  int calls = 0;
  nn::update_fp8_metas(two, [&](at::Tensor& all) {
    ++calls;
    ASSERT_EQ(all.numel(), 6);
    EXPECT_TRUE(at::equal(all, at::tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f})));
    all = at::maximum(all, at::tensor({8.f, 0.f, 0.f, 0.f, 0.f, 12.f}));  // another rank's
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(two.a->meta->scale[0].item<float>(), factor_of(8.0, fp8::Format::E4M3));
  EXPECT_EQ(two.a->meta->scale[1].item<float>(), factor_of(2.0, fp8::Format::E4M3));
  EXPECT_EQ(two.b->meta->scale[2].item<float>(), factor_of(12.0, fp8::Format::E5M2));
}

// Products take slots in call order, again from 0 in each scope (a recompute records the same
// amaxes into the same slots, a maximum being idempotent); one product more than the meta has
// room for, or a delayed recipe without a meta, is an error naming it. Casting the module to
// bf16 leaves the history and scales fp32.
TEST(Fp8Delayed, SlotsFollowTheCallOrderAndTheStateStaysFp32) {
  const nn::Fp8Recipe r = delayed(2, nn::Fp8AmaxAlgo::Max);
  Holder holder(2, r);
  const at::Tensor a = at::randn({16, 16}), b = at::randn({16, 16}) * 3;
  for (int pass = 0; pass < 2; ++pass) {
    nn::Fp8Autocast scope(r, holder.meta.ptr().get());
    nn::linear(a, b, at::Tensor());
    nn::linear(b, a, at::Tensor());
  }
  const at::Tensor row0 = holder.meta->amax_history[0];
  EXPECT_EQ(row0[0].item<float>(), a.abs().max().item<float>());
  EXPECT_EQ(row0[1].item<float>(), b.abs().max().item<float>());
  EXPECT_EQ(row0[3].item<float>(), b.abs().max().item<float>());
  EXPECT_EQ(row0[4].item<float>(), a.abs().max().item<float>());
  {
    nn::Fp8Autocast scope(r, holder.meta.ptr().get());
    nn::linear(a, b, at::Tensor());
    nn::linear(a, b, at::Tensor());
    try {
      nn::linear(a, b, at::Tensor());
      FAIL() << "a third product accepted";
    } catch (const fp8::Fp8Error& e) {
      EXPECT_NE(std::string(e.what()).find("room for 2"), std::string::npos) << e.what();
    }
  }
  {
    nn::Fp8Autocast scope(r);
    EXPECT_THROW(nn::linear(a, b, at::Tensor()), fp8::Fp8Error);
  }
  holder.to(at::kBFloat16);
  EXPECT_EQ(holder.meta->amax_history.scalar_type(), at::kFloat);
  EXPECT_EQ(holder.meta->scale.scalar_type(), at::kFloat);
}
