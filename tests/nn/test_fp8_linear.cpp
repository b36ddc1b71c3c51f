// FP8 scales and the FP8 linear (ops/fp8.h, nn/fp8_linear.h) against hand-computed scales and
// a float64 reference of quantise, dequantise, multiply, on the CPU (at::_scaled_mm runs there).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <optional>
#include <utility>

#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/fp8_meta.h"
#include "dscpp/nn/linear.h"
#include "dscpp/ops/fp8.h"
#include "tests/gpu_skip.h"

namespace fp8 = dscpp::ops::fp8;
using dscpp::nn::Fp8Autocast;
using dscpp::nn::Fp8Meta;
using dscpp::nn::Fp8Recipe;
using dscpp::nn::Fp8Scaling;
using dscpp::nn::Fp8WeightCastsNotKept;

namespace {

double rel(double got, double want) {
  return std::abs(got - want) / std::abs(want);
}

// The reference's quantisation: scale by hand (amax / max, per tensor; per slice along
// `reduced`, rounded up to a power of two, for rowwise), the fp8 cast as the rounding, then
// back to float64 times the scale.
at::Tensor reference_qd(const at::Tensor& x, int64_t reduced, fp8::Format f, bool rowwise) {
  const at::Tensor xd = x.to(at::kDouble);
  at::Tensor scale;
  if (rowwise) {
    scale = at::exp2(at::ceil(at::log2(xd.abs().amax({reduced}, true) / fp8::max_finite(f))));
  } else {
    scale = xd.abs().amax() / fp8::max_finite(f);
  }
  const double m = fp8::max_finite(f);
  return (xd / scale).clamp(-m, m).to(at::kFloat).to(fp8::dtype(f)).to(at::kDouble) * scale;
}

}  // namespace

TEST(Fp8Scales, TensorwiseIsTheAbsoluteMaximumOverTheFormatsLargestValue) {
  const at::Tensor x = at::tensor({0.25, -3.5, 1.0, 2.0}, at::kFloat).reshape({2, 2});
  EXPECT_LT(rel(fp8::quantize_tensorwise(x, fp8::Format::E4M3).scale.item<double>(), 3.5 / 448),
            1e-6);
  EXPECT_LT(rel(fp8::quantize_tensorwise(x, fp8::Format::E5M2).scale.item<double>(), 3.5 / 57344),
            1e-6);
  // fp8_margin 2: four times the range left free.
  EXPECT_LT(
      rel(fp8::quantize_tensorwise(x, fp8::Format::E4M3, 2).scale.item<double>(), 4 * 3.5 / 448),
      1e-6);
}

TEST(Fp8Scales, RowwiseIsEachRowsMaximumRoundedUpToAPowerOfTwo) {
  // Row maxima 1, 3 and 448: scales 2^ceil(log2(amax / 448)) = 2^-8, 2^-7, 1.
  const at::Tensor x = at::tensor({1.0, -0.5, 3.0, 0.0, -448.0, 7.0}, at::kFloat).reshape({3, 2});
  const fp8::Quantized q = fp8::quantize_axiswise(x, 1, fp8::Format::E4M3);
  ASSERT_EQ(q.scale.sizes(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(q.scale[0].item<float>(), std::ldexp(1.0f, -8));
  EXPECT_EQ(q.scale[1].item<float>(), std::ldexp(1.0f, -7));
  EXPECT_EQ(q.scale[2].item<float>(), 1.0f);
  // Per column (reduced over the rows): maxima 448 and 7.
  const fp8::Quantized c = fp8::quantize_axiswise(x, 0, fp8::Format::E4M3);
  ASSERT_EQ(c.scale.sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.scale[0][1].item<float>(), std::ldexp(1.0f, -6));  // 7 / 448 = 2^-6
}

TEST(Fp8Quantize, SaturatesAtTheFormatsLargestValue) {
  const at::Tensor x = at::tensor({1000.0, -1e6, 3.0}, at::kFloat).reshape({1, 3});
  const at::Tensor one = at::ones({}, at::kFloat);
  const at::Tensor e4 = fp8::quantize(x, one, fp8::Format::E4M3).data.to(at::kFloat);
  EXPECT_EQ(e4[0][0].item<float>(), 448.0f);
  EXPECT_EQ(e4[0][1].item<float>(), -448.0f);
  EXPECT_EQ(e4[0][2].item<float>(), 3.0f);
  const at::Tensor e5 = fp8::quantize(x, one, fp8::Format::E5M2).data.to(at::kFloat);
  EXPECT_EQ(e5[0][1].item<float>(), -57344.0f);
}

TEST(Fp8Recipe, ParsesMegatronsValuesAndNamesAWrongOne) {
  const Fp8Recipe r = dscpp::nn::fp8_recipe_from("e4m3", "rowwise", 1);
  EXPECT_FALSE(r.hybrid);
  EXPECT_EQ(r.scaling, Fp8Scaling::Rowwise);
  EXPECT_EQ(r.margin, 1);
  try {
    dscpp::nn::fp8_recipe_from("e5m2", "tensorwise", 0);
    FAIL() << "e5m2 accepted";
  } catch (const fp8::Fp8Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"e5m2\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(dscpp::nn::fp8_recipe_from("hybrid", "blockwise", 0), fp8::Fp8Error);
}

// y = x·Wᵀ + b and its gradients through nn::linear in an Fp8Autocast scope, against float64
// products of the operands quantised by hand on the recipe's axes:
//   y  = q(x, per row) · q(W, per row)ᵀ + b
//   dx = q(dy, per row, grad format) · q(W, per column)
//   dW = q(dy, per column, grad format)ᵀ · q(x, per column)
// On the CPU in fp32; on a GPU in bf16, through the cast kernel (ops/fp8_cast.cu) and cuBLASLt's
// fp8 product, the reference taking the same bf16 inputs.
class Fp8LinearMatchesFloat64 : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(Fp8LinearMatchesFloat64, ForwardAndBothGradients) {
  const auto [rowwise, hybrid, cuda] = GetParam();
  if (cuda) DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(7);
  // The GPU takes bf16 (rowwise products there give bf16 only); the reference reads the same
  // rounded values.
  const at::ScalarType type = cuda ? at::kBFloat16 : at::kFloat;
  auto input = [&](const at::Tensor& t) { return t.to(type).to(at::kFloat); };
  const at::Tensor x0 = input(at::randn({32, 64}) * at::linspace(0.1, 4.0, 64));  // uneven columns
  const at::Tensor w0 = input(at::randn({48, 64}) * 0.05);
  const at::Tensor b0 = input(at::randn({48}));
  const at::Tensor dy = input(at::randn({32, 48}) * at::linspace(0.01, 2.0, 32).unsqueeze(1));

  Fp8Recipe recipe;
  recipe.hybrid = hybrid;
  recipe.scaling = rowwise ? Fp8Scaling::Rowwise : Fp8Scaling::Tensorwise;
  const at::Device device = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  auto leaf = [&](const at::Tensor& t) { return t.to(device, type).requires_grad_(true); };
  at::Tensor x = leaf(x0), w = leaf(w0), b = leaf(b0);
  at::Tensor y;
  {
    Fp8Autocast scope(recipe);
    y = dscpp::nn::linear(x, w, b);
  }
  torch::autograd::backward({y}, {dy.to(device, type)});

  const fp8::Format e4 = fp8::Format::E4M3;
  const fp8::Format gf = hybrid ? fp8::Format::E5M2 : fp8::Format::E4M3;
  const at::Tensor y_ref =
      at::mm(reference_qd(x0, 1, e4, rowwise), reference_qd(w0, 1, e4, rowwise).t()) +
      b0.to(at::kDouble);
  const at::Tensor dx_ref =
      at::mm(reference_qd(dy, 1, gf, rowwise), reference_qd(w0, 0, e4, rowwise));
  const at::Tensor dw_ref =
      at::mm(reference_qd(dy, 0, gf, rowwise).t(), reference_qd(x0, 0, e4, rowwise));
  // fp32 accumulation of the same fp8 operands: ~1e-7 of the result's scale; in bf16 the
  // result's own rounding, 2^-8 of each value. A wrong scale or operand is off by O(1).
  const double tol = cuda ? 1e-2 : 1e-5;
  auto check = [tol](const at::Tensor& got, const at::Tensor& want, const char* what) {
    const double err = (got.to(at::kCPU, at::kDouble) - want).abs().max().item<double>();
    const double scale = want.abs().max().item<double>();
    EXPECT_LT(err, tol * scale) << what << ": max |diff| " << err << " of " << scale;
  };
  check(y, y_ref, "y");
  check(x.grad(), dx_ref, "dx");
  check(w.grad(), dw_ref, "dW");
  check(b.grad(), dy.sum(0).to(at::kDouble), "db");

  // The products are fp8's: far from the exact ones (e4m3 keeps 3 mantissa bits), farther
  // than bf16's rounding of the result on the GPU.
  const at::Tensor exact = at::mm(x0.to(at::kDouble), w0.to(at::kDouble).t()) + b0.to(at::kDouble);
  EXPECT_GT((y.to(at::kCPU, at::kDouble) - exact).abs().max().item<double>(),
            (cuda ? 1e-2 : 1e-3) * exact.abs().max().item<double>());
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8LinearMatchesFloat64,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Rowwise" : "Tensorwise") +
                                  (std::get<1>(info.param) ? "Hybrid" : "E4m3") +
                                  (std::get<2>(info.param) ? "Cuda" : "");
                         });

// With one scale a tensor, backward takes Wᵀ's fp8 from forward's cast of W; under
// Fp8WeightCastsNotKept (a layer ZeRO-3 releases after forward) it casts W again. The same
// scale and the same bytes either way: the gradients agree bit for bit, for the tensorwise and
// the delayed recipes. Rowwise casts W per column in backward in both cases.
TEST(Fp8Linear, ForwardsWeightCastGivesBackwardTheSameGradientsAsASecondCast) {
  at::manual_seed(11);
  const at::Tensor x0 = at::randn({32, 64});
  const at::Tensor w0 = at::randn({48, 64}) * 0.05;
  const at::Tensor dy = at::randn({32, 48});
  for (const Fp8Scaling scaling : {Fp8Scaling::Tensorwise, Fp8Scaling::Delayed}) {
    Fp8Recipe recipe;
    recipe.scaling = scaling;
    auto grads = [&](bool kept) {
      at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      Fp8Meta meta(nullptr);
      if (scaling == Fp8Scaling::Delayed) meta = Fp8Meta(1, recipe);
      at::Tensor y;
      {
        std::optional<Fp8WeightCastsNotKept> not_kept;
        if (!kept) not_kept.emplace();
        Fp8Autocast scope(recipe, meta.is_empty() ? nullptr : meta.get());
        y = dscpp::nn::linear(x, w);
      }
      torch::autograd::backward({y}, {dy});
      return std::make_pair(x.grad(), w.grad());
    };
    const auto [dx_kept, dw_kept] = grads(true);
    const auto [dx_again, dw_again] = grads(false);
    const char* name = scaling == Fp8Scaling::Delayed ? "delayed" : "tensorwise";
    EXPECT_TRUE(at::equal(dx_kept, dx_again)) << name << ": dx";
    EXPECT_TRUE(at::equal(dw_kept, dw_again)) << name << ": dW";
    // And the kept cast is W's, not some other tensor's: dx is far from zero and close to
    // the high-precision product.
    const at::Tensor exact = at::mm(dy, w0);
    EXPECT_LT((dx_kept - exact).abs().max().item<double>(), 0.1 * exact.abs().max().item<double>())
        << name;
  }
}

TEST(Fp8Autocast, AnInnerEmptyScopeKeepsHighPrecisionAndTheOuterComesBack) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({16, 32});
  const at::Tensor w = at::randn({16, 32});
  const at::Tensor exact = at::mm(x, w.t());
  Fp8Autocast outer(Fp8Recipe{});
  {
    Fp8Autocast inner(std::nullopt);
    EXPECT_TRUE(at::allclose(dscpp::nn::linear(x, w), exact, 1e-5, 1e-5));
  }
  EXPECT_FALSE(at::allclose(dscpp::nn::linear(x, w), exact, 1e-3, 1e-3));
}
