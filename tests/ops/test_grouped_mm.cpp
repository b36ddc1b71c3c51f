// ops::grouped_mm against float64 autograd of the loop of products (forward, d_rows,
// d_weights), on ATen's grouped path (aligned fp32 and bf16) and on the loop (float64, widths
// that break _grouped_mm's 16-byte stride rule), with empty groups and no rows at all, and
// padding rows past the counts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/grouped_mm.h"

namespace {

struct Case {
  std::vector<int64_t> counts;
  int64_t in, out;
  at::ScalarType dtype;
  bool aten;  // the path grouped_mm must take
  double rtol, atol;
};

// The reference: the loop of products in float64 under autograd.
std::vector<at::Tensor> grouped_mm_reference(const at::Tensor& rows, const at::Tensor& weights,
                                             const std::vector<int64_t>& counts,
                                             const at::Tensor& grad) {
  at::Tensor r = rows.to(at::kDouble).detach().requires_grad_(true);
  at::Tensor w = weights.to(at::kDouble).detach().requires_grad_(true);
  std::vector<at::Tensor> parts;
  int64_t o = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    parts.push_back(at::matmul(r.narrow(0, o, counts[e]), w[e]));
    o += counts[e];
  }
  at::Tensor y = at::cat(parts);
  auto g = torch::autograd::grad({y}, {r, w}, {grad.to(at::kDouble)});
  return {y.detach(), g[0], g[1]};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const Case& c, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.scalar_type(), c.dtype) << what;
  EXPECT_TRUE(at::allclose(got.to(at::kDouble), want, c.rtol, c.atol))
      << what << ": max error " << (got.to(at::kDouble) - want).abs().max().item<double>();
}

TEST(GroupedMm, MatchesTheLoopOfProductsWithItsGradients) {
  const std::vector<Case> cases = {
      {{3, 0, 5, 2}, 8, 4, at::kFloat, true, 1e-6, 1e-6},      // aligned fp32, an empty group
      {{0, 7, 0}, 4, 12, at::kFloat, true, 1e-6, 1e-6},        // empty first and last
      {{3, 0, 5, 2}, 3, 5, at::kFloat, false, 1e-6, 1e-6},     // unaligned widths: the loop
      {{4, 1, 0, 6}, 16, 8, at::kBFloat16, true, 2e-2, 5e-2},  // bf16, aligned
      {{2, 2}, 8, 4, at::kBFloat16, false, 2e-2, 5e-2},        // bf16, out*2 not 16: the loop
      {{5, 0, 3}, 6, 6, at::kDouble, false, 1e-12, 1e-12},     // float64: the loop
      {{0, 0}, 8, 8, at::kFloat, true, 0, 0},                  // no rows at all
  };
  at::manual_seed(7);
  for (const auto& c : cases) {
    int64_t n = 0;
    for (int64_t x : c.counts) n += x;
    const auto e = static_cast<int64_t>(c.counts.size());
    at::Tensor rows = at::randn({n, c.in}).to(c.dtype).requires_grad_(true);
    at::Tensor weights = at::randn({e, c.in, c.out}).to(c.dtype).requires_grad_(true);
    at::Tensor grad = at::randn({n, c.out}).to(c.dtype);
    at::Tensor counts = at::tensor(c.counts, at::kLong);
    SCOPED_TRACE(::testing::Message() << "counts " << counts << " in " << c.in << " out " << c.out
                                      << " " << c10::toString(c.dtype));
    EXPECT_EQ(dscpp::ops::grouped_mm_uses_aten(rows, weights), c.aten);
    at::Tensor y = dscpp::ops::grouped_mm(rows, weights, counts);
    auto g = torch::autograd::grad({y}, {rows, weights}, {grad});
    auto want = grouped_mm_reference(rows, weights, c.counts, grad);
    expect_close(y, want[0], c, "output");
    expect_close(g[0], want[1], c, "d_rows");
    expect_close(g[1], want[2], c, "d_weights");
    // The loop itself agrees with the grouped product (bit-equal on ATen's CPU path).
    at::Tensor loop = dscpp::ops::grouped_mm_loop(rows.detach(), weights.detach(), counts);
    expect_close(loop, y.detach().to(at::kDouble), c, "loop vs grouped");
    for (int64_t k = 0; k < e; ++k)
      if (c.counts[k] == 0) {
        EXPECT_EQ(g[1][k].abs().max().item<double>(), 0.0);
      }
  }
}

// Rows past sum(counts) (the MoE permutation's padding on a GPU) take no part: NaN there
// changes neither the counted rows' outputs nor any gradient; their own d_rows are unspecified.
TEST(GroupedMm, IgnoresPaddingRowsPastTheCounts) {
  const std::vector<Case> cases = {{{3, 0, 5}, 8, 4, at::kFloat, true, 1e-6, 1e-6},
                                   {{3, 0, 5}, 3, 5, at::kDouble, false, 1e-12, 1e-12}};
  at::manual_seed(11);
  for (const auto& c : cases) {
    SCOPED_TRACE(c10::toString(c.dtype));
    const int64_t n = 8, pad = 4;
    at::Tensor counted = at::randn({n, c.in}).to(c.dtype);
    at::Tensor rows =
        at::cat({counted, at::full({pad, c.in}, NAN, counted.options())}).requires_grad_(true);
    at::Tensor weights = at::randn({3, c.in, c.out}).to(c.dtype).requires_grad_(true);
    at::Tensor grad = at::randn({n + pad, c.out}).to(c.dtype);
    at::Tensor y = dscpp::ops::grouped_mm(rows, weights, at::tensor(c.counts, at::kLong));
    ASSERT_EQ(y.size(0), n + pad);
    auto g = torch::autograd::grad({y}, {rows, weights}, {grad});
    auto want = grouped_mm_reference(counted, weights, c.counts, grad.narrow(0, 0, n));
    expect_close(y.narrow(0, 0, n), want[0], c, "output");
    expect_close(g[0].narrow(0, 0, n), want[1], c, "d_rows");
    expect_close(g[1], want[2], c, "d_weights");
    if (!c.aten) {
      EXPECT_EQ(y.narrow(0, n, pad).abs().max().item<double>(), 0.0);
    }
  }
}

TEST(GroupedMm, RefusesBadShapesAndCounts) {
  at::Tensor rows = at::randn({6, 8}), weights = at::randn({3, 8, 4});
  EXPECT_THROW(dscpp::ops::grouped_mm(rows, weights, at::tensor({1, 2, 4}, at::kLong)),
               dscpp::Error);  // sums to 7, more than the 6 rows
  EXPECT_THROW(dscpp::ops::grouped_mm(rows, weights, at::tensor({6, -1, 1}, at::kLong)),
               dscpp::Error);
  EXPECT_THROW(dscpp::ops::grouped_mm(rows, weights, at::tensor({3, 3}, at::kLong)),
               dscpp::Error);  // 2 counts for 3 experts
  EXPECT_THROW(dscpp::ops::grouped_mm(rows, at::randn({3, 7, 4}), at::tensor({2, 2, 2}, at::kLong)),
               dscpp::Error);
  EXPECT_THROW(dscpp::ops::grouped_mm(rows, weights, at::tensor({2, 2, 2}, at::kInt)),
               dscpp::Error);
}

}  // namespace
