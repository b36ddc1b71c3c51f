// The FP8 cast kernel (ops/fp8_cast.cu, through fp8::quantize_layouts) against the formula
// written out here in ATen's operations on the same GPU: the scale from the absolute maximum
// in float64 (torchao's), the fp32 product, the clamp and ATen's own cast to fp8. Every byte
// and every scale must agree, in both layouts, for fp32, bf16 and fp16 inputs, both formats,
// one scale or one per row or column, with and without a margin and power-of-two scales, odd
// shapes (tiles cut by the edges) and a strided input. Skips without a GPU.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/ops/fp8.h"
#include "tests/gpu_skip.h"

namespace {

namespace fp8 = dscpp::ops::fp8;

// The formula of ops/fp8.h in ATen operations.
fp8::Quantized reference(const at::Tensor& x, int64_t reduced, fp8::Format f, int margin,
                         bool power_of_2) {
  const at::Tensor amax = reduced < 0 ? x.abs().amax() : x.abs().amax({reduced}, true);
  const double m = fp8::max_finite(f);
  at::Tensor q =
      (m / (amax.to(at::kDouble).clamp_min(1e-12) * std::ldexp(1.0, margin))).to(at::kFloat);
  if (power_of_2) q = at::exp2(at::floor(at::log2(q)));
  const at::Tensor data = (x.to(at::kFloat) * q).clamp(-m, m).to(fp8::dtype(f));
  return {data, q.reciprocal()};
}

void expect_same(const fp8::Quantized& got, const fp8::Quantized& want, const char* layout) {
  ASSERT_EQ(got.data.sizes(), want.data.sizes()) << layout;
  ASSERT_EQ(got.data.scalar_type(), want.data.scalar_type()) << layout;
  const at::Tensor differ = got.data.view(at::kByte).ne(want.data.view(at::kByte));
  EXPECT_EQ(differ.sum().item<int64_t>(), 0) << layout << ": fp8 bytes differ";
  ASSERT_EQ(got.scale.sizes(), want.scale.sizes()) << layout << ": the scale's shape";
  EXPECT_TRUE(at::equal(got.scale, want.scale)) << layout << ": scales differ";
}

// Values over many binades (fp8's subnormals included) and of both signs, with one large
// column and one tiny row so that per-row and per-column scales differ from the tensor's.
at::Tensor input(int64_t rows, int64_t cols, at::ScalarType type) {
  at::Tensor x = at::randn({rows, cols}, at::kDouble) *
                 at::exp2(at::randint(-12, 6, {rows, cols}, at::kDouble));
  x.select(1, cols / 2).mul_(64.0);
  x.select(0, rows / 2).mul_(1.0 / 1024.0);
  return x.to(at::kCUDA, type);
}

TEST(Fp8CastCuda, BothLayoutsMatchTheFormulaInAtenByteForByte) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(42);
  // Whole tiles on the wide path ([256, 1024]), edge tiles beside wide ones ([208, 136]), and
  // shapes the wide accesses do not fit.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {3, 13}, {33, 65}, {64, 48}, {1000, 37}, {208, 136}, {256, 1024}};
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf})
    for (const auto& [rows, cols] : shapes)
      for (const fp8::Format f : {fp8::Format::E4M3, fp8::Format::E5M2})
        for (const int64_t reduced : {-1, 0, 1})
          for (const int margin : {0, 2}) {
            const bool power_of_2 = reduced >= 0 && margin == 0;
            SCOPED_TRACE(fmt::format("{} [{}, {}] {} reduced {} margin {} pow2 {}",
                                     c10::toString(type), rows, cols, fp8::name(f), reduced, margin,
                                     power_of_2));
            const at::Tensor x = input(rows, cols, type);
            const fp8::Quantized want = reference(x, reduced, f, margin, power_of_2);
            const fp8::Layouts got =
                fp8::quantize_layouts(x, reduced, f, margin, power_of_2, true, true);
            expect_same(got.rows, want, "rows");
            const fp8::Quantized want_t{want.data.t().contiguous(),
                                        want.scale.dim() == 2 ? want.scale.t() : want.scale};
            expect_same(got.transposed, want_t, "transposed");
          }
}

// The tensor's absolute maximum (ops/fp8_cast.cu's reduction, behind fp8::amax and every
// one-scale cast) against ATen's abs().amax(), exactly: lengths below one pack, with a tail
// after the packs, and over more packs than the grid has threads (grid-stride); a start that
// is not 16-byte aligned; a NaN anywhere gives NaN and an infinity infinity.
TEST(Fp8CastCuda, TheAbsoluteMaximumIsAtensExactly) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(47);
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const int64_t n :
         {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{4099}, int64_t{5'000'011}}) {
      for (const int64_t offset : {0, 1}) {
        const at::Tensor base = input(1, n + offset, type).view({-1});
        const at::Tensor x = base.narrow(0, offset, n);
        const std::string what = fmt::format("{} n={} offset={}", c10::toString(type), n, offset);
        EXPECT_TRUE(at::equal(fp8::amax(x).cpu(), x.abs().amax().to(at::kFloat).cpu())) << what;
        at::Tensor y = x.clone();
        y[n - 1] = INFINITY;
        EXPECT_TRUE(std::isinf(fp8::amax(y).item<float>())) << what << ": infinity";
        y[n / 2] = NAN;
        EXPECT_TRUE(std::isnan(fp8::amax(y).item<float>())) << what << ": NaN";
      }
    }
  }
}

// Delayed scaling's cast, by a factor kept from earlier steps (here one that saturates part of
// x, as a stale factor does when the values grow), against the same formula with that factor.
TEST(Fp8CastCuda, AKnownFactorCastsAsTheFormulaWithIt) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(45);
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16})
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{33, 65}, {256, 1024}})
      for (const fp8::Format f : {fp8::Format::E4M3, fp8::Format::E5M2}) {
        SCOPED_TRACE(fmt::format("{} [{}, {}] {}", c10::toString(type), rows, cols, fp8::name(f)));
        const at::Tensor x = input(rows, cols, type);
        const at::Tensor factor =
            (4.0 * fp8::max_finite(f) / x.abs().amax().to(at::kDouble)).to(at::kFloat).cpu();
        const double m = fp8::max_finite(f);
        const fp8::Quantized want{
            (x.to(at::kFloat) * factor.to(at::kCUDA)).clamp(-m, m).to(fp8::dtype(f)),
            factor.to(at::kCUDA).reciprocal()};
        const fp8::Layouts got =
            fp8::quantize_layouts_by_factor(x, factor.to(at::kCUDA).reshape({}), f, true, true);
        expect_same(got.rows, want, "rows");
        expect_same(got.transposed, {want.data.t().contiguous(), want.scale}, "transposed");
        EXPECT_GT(got.rows.data.to(at::kFloat).abs().eq(m).sum().item<int64_t>(), 0)
            << "the factor was to saturate some values";
      }
}

TEST(Fp8CastCuda, OneLayoutAloneAndAStridedInput) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(43);
  const at::Tensor wide = input(96, 160, at::kBFloat16);
  const at::Tensor strided = wide.t();  // [160, 96], not contiguous
  const fp8::Quantized want = reference(strided, 1, fp8::Format::E4M3, 0, true);
  const fp8::Layouts only_rows =
      fp8::quantize_layouts(strided, 1, fp8::Format::E4M3, 0, true, true, false);
  expect_same(only_rows.rows, want, "rows alone");
  EXPECT_FALSE(only_rows.transposed.data.defined());
  const fp8::Layouts only_t =
      fp8::quantize_layouts(strided, 1, fp8::Format::E4M3, 0, true, false, true);
  EXPECT_FALSE(only_t.rows.data.defined());
  expect_same(only_t.transposed, {want.data.t().contiguous(), want.scale.t()}, "transposed alone");
}

TEST(Fp8CastCuda, TheProductOfKernelOperandsIsTheCompositionsProduct) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(44);
  // y = x · Wᵀ from the kernel's operands (W's transposed view is column-major) against the
  // dequantised operands multiplied in float64: only the product's fp32 sum and bf16 rounding
  // differ.
  const at::Tensor x = at::randn({128, 256}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor w = (at::randn({64, 256}, at::kCUDA) * 0.05).to(at::kBFloat16);
  const fp8::Quantized xq =
      fp8::quantize_layouts(x, -1, fp8::Format::E4M3, 0, false, true, false).rows;
  const fp8::Quantized wq =
      fp8::quantize_layouts(w, -1, fp8::Format::E4M3, 0, false, true, false).rows;
  const at::Tensor y = fp8::scaled_mm(xq, {wq.data.t(), wq.scale}, at::kBFloat16);
  const at::Tensor want =
      at::mm(fp8::dequantize(xq).to(at::kDouble), fp8::dequantize(wq).to(at::kDouble).t());
  const double err = (y.to(at::kDouble) - want).abs().max().item<double>();
  EXPECT_LT(err, 1e-2 * want.abs().max().item<double>());
}

}  // namespace
