// ops::moe_permute / moe_unpermute on their ATen path (every build; the CUDA kernels have
// their own test against this path, test_moe_permute_cuda.cpp): a hand-computed routing with
// dropped routes (rows, counts, both maps), the weighted combine against a loop in double,
// gradients against central differences in float64, a padded permutation (the kernels'
// format) whose NaN padding rows change nothing, the capacity's fixed layout, and the refusals.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/moe_permute.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::moe_permute;
using dscpp::ops::moe_unpermute;
using dscpp::ops::MoePermutation;

// 4 tokens, k = 2, 3 experts; routes 3 (token 1's second) and 6 (token 3's first) dropped.
//   flat route: 0  1  2  3  4  5  6  7
//   expert:     2  0  0  1  2  1  0  2
at::Tensor kIndices() {
  return at::tensor({2, 0, 0, 1, 2, 1, 0, 2}, at::kLong).view({4, 2});
}
at::Tensor kKept() {
  return at::tensor({1, 1, 1, 0, 1, 1, 0, 1}, at::kLong).view({4, 2}).to(at::kBool);
}

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(MoePermute, SortsTheKeptRoutesByExpertStably) {
  const at::Tensor tokens = at::arange(8, at::kFloat).view({4, 2});  // token t: {2t, 2t + 1}
  const MoePermutation p = moe_permute(tokens, kIndices(), kKept(), 3);
  // expert 0: routes 1, 2; expert 1: route 5; expert 2: routes 0, 4, 7.
  EXPECT_EQ(values(p.counts), (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(values(p.row_route), (std::vector<int64_t>{1, 2, 5, 0, 4, 7}));
  EXPECT_EQ(values(p.route_dest), (std::vector<int64_t>{3, 0, 1, -1, 4, 2, -1, 5}));
  EXPECT_FALSE(p.padded);
  const at::Tensor want = tokens.index_select(0, at::tensor({0, 1, 2, 0, 2, 3}, at::kLong));
  EXPECT_TRUE(at::equal(p.rows, want));
  EXPECT_FALSE(dscpp::ops::moe_permute_uses_kernels(tokens, 3));  // CPU: the ATen path
}

// The capacity layout (moe_permute_padded): C slots per expert, kept routes first, zero rows
// after; a kept route past C is left out (the router never keeps one; hand-computed).
TEST(MoePermute, PaddedLaysEachExpertsRoutesInItsCapacitySlots) {
  const at::Tensor tokens = at::arange(8, at::kFloat).view({4, 2}) + 1;  // no zero token
  const MoePermutation p = dscpp::ops::moe_permute_padded(tokens, kIndices(), kKept(), 3, 2);
  // expert 0: routes 1, 2; expert 1: route 5, then padding; expert 2: routes 0, 4 (7 is past C).
  EXPECT_EQ(values(p.counts), (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(values(p.row_route), (std::vector<int64_t>{1, 2, 5, -1, 0, 4}));
  EXPECT_EQ(values(p.route_dest), (std::vector<int64_t>{4, 0, 1, -1, 5, 2, -1, -1}));
  EXPECT_TRUE(p.padded);
  at::Tensor want = tokens.index_select(0, at::tensor({0, 1, 2, 0, 0, 2}, at::kLong));
  want[3].zero_();
  EXPECT_TRUE(at::equal(p.rows, want));
  // With room for every kept route, combining equals the exact permutation's.
  const at::Tensor weights = at::rand({4, 2}) * kKept().to(at::kFloat);
  const MoePermutation roomy = dscpp::ops::moe_permute_padded(tokens, kIndices(), kKept(), 3, 3);
  const MoePermutation exact = moe_permute(tokens, kIndices(), kKept(), 3);
  EXPECT_TRUE(at::allclose(moe_unpermute(roomy.rows * 2, weights, roomy),
                           moe_unpermute(exact.rows * 2, weights, exact)));
  EXPECT_THROW(dscpp::ops::moe_permute_padded(tokens, kIndices(), kKept(), 3, -1), dscpp::Error);
}

TEST(MoePermute, UnpermuteWeighsAndSumsIntoTheTokens) {
  at::manual_seed(3);
  const at::Tensor tokens = at::randn({4, 3});
  const at::Tensor weights = at::rand({4, 2}) * kKept().to(at::kFloat);
  const MoePermutation p = moe_permute(tokens, kIndices(), kKept(), 3);
  const at::Tensor y = at::randn({p.rows.size(0), 5}, at::kDouble);
  const at::Tensor out = moe_unpermute(y, weights, p);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(out.scalar_type(), at::kDouble);
  at::Tensor want = at::zeros({4, 5}, at::kDouble);
  const auto dest = values(p.route_dest);
  for (int64_t r = 0; r < 8; ++r)
    if (dest[r] >= 0) want[r / 2] += weights.view({-1})[r].item<double>() * y[dest[r]];
  EXPECT_LT(dscpp::ops::test::rel_err(out, want), 1e-7);  // fp32 accumulation
}

TEST(MoePermute, GradientsMatchCentralDifferences) {
  at::manual_seed(5);
  const at::Tensor scale = at::randn({6, 3}, at::kDouble);  // a non-uniform "expert"
  const auto f = [&](const std::vector<at::Tensor>& in) {
    const MoePermutation p = moe_permute(in[0], kIndices(), kKept(), 3);
    return moe_unpermute(p.rows * scale, in[1].to(at::kFloat), p);
  };
  const at::Tensor tokens = at::randn({4, 3}, at::kDouble).requires_grad_(true);
  const at::Tensor weights = at::rand({4, 2}, at::kDouble).requires_grad_(true);
  const at::Tensor w = at::randn({4, 3}, at::kDouble);
  // f is linear in each input, so central differences are exact but for rounding, and a large
  // step keeps the fp32 rounding (the weights and the sums are fp32: the op's contract) small.
  EXPECT_LT(dscpp::ops::test::max_gradient_error(f, {tokens, weights}, w, 0.1), 1e-5);
  // A dropped route's weight gets no gradient.
  EXPECT_EQ(weights.grad()[1][1].item<double>(), 0.0);
  EXPECT_EQ(weights.grad()[3][0].item<double>(), 0.0);
}

// The kernels' format: rows past sum(counts) are padding (row_route -1). On the ATen unpermute
// such rows may hold NaN: the output, and every gradient but the padding's own (zero), are
// those of the unpadded permutation.
TEST(MoePermute, UnpermuteIgnoresPaddingRows) {
  at::manual_seed(9);
  const at::Tensor tokens = at::randn({4, 3});
  const MoePermutation p = moe_permute(tokens, kIndices(), kKept(), 3);
  MoePermutation padded = p;
  padded.padded = true;
  padded.row_route = at::cat({p.row_route, at::full({2}, -1, at::kLong)});
  const at::Tensor y = at::randn({6, 4});
  const at::Tensor y_padded = at::cat({y, at::full({2, 4}, NAN)}).requires_grad_(true);
  const at::Tensor y_plain = y.clone().requires_grad_(true);
  const at::Tensor w1 = at::rand({4, 2}).requires_grad_(true),
                   w2 = w1.detach().clone().requires_grad_(true);
  const at::Tensor grad = at::randn({4, 4});
  const at::Tensor out_padded = moe_unpermute(y_padded, w1, padded);
  const at::Tensor out_plain = moe_unpermute(y_plain, w2, p);
  EXPECT_TRUE(at::allclose(out_padded, out_plain));
  auto gp = torch::autograd::grad({out_padded}, {y_padded, w1}, {grad});
  auto gq = torch::autograd::grad({out_plain}, {y_plain, w2}, {grad});
  EXPECT_TRUE(at::allclose(gp[0].narrow(0, 0, 6), gq[0]));
  EXPECT_EQ(gp[0].narrow(0, 6, 2).abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(at::allclose(gp[1], gq[1]));
  // Fewer expert rows than the permutation has (an expert-parallel combine returns exactly
  // sum(counts)): the same result.
  EXPECT_TRUE(at::allclose(moe_unpermute(y, w1.detach(), padded), out_plain));
}

TEST(MoePermute, NothingKeptGivesNoRowsAndZeros) {
  const at::Tensor tokens = at::randn({3, 4});
  const at::Tensor indices = at::zeros({3, 1}, at::kLong);
  const MoePermutation p = moe_permute(tokens, indices, at::zeros({3, 1}, at::kBool), 2);
  EXPECT_EQ(p.rows.size(0), 0);
  EXPECT_EQ(values(p.counts), (std::vector<int64_t>{0, 0}));
  const at::Tensor out = moe_unpermute(at::zeros({0, 4}), at::zeros({3, 1}), p);
  EXPECT_EQ(out.abs().max().item<float>(), 0.0f);
}

TEST(MoePermute, RefusesBadInputNamingIt) {
  const at::Tensor tokens = at::randn({4, 3});
  const auto throws_with = [](const auto& fn, const std::string& words) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one naming " << words;
    } catch (const dscpp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  throws_with(
      [&] {
        moe_permute(tokens.view({2, 2, 3}), kIndices(), kKept(), 3);
      },
      "tokens [S, H]");
  throws_with([&] { moe_permute(tokens, kIndices().to(at::kInt), kKept(), 3); }, "int64 indices");
  throws_with([&] { moe_permute(tokens, kIndices(), kKept(), 0); }, "num_experts");
  throws_with([&] { moe_permute(tokens, kIndices(), kKept(), 2); }, "outside [0, 2)");
  throws_with([&] { moe_permute(tokens.narrow(0, 0, 3), kIndices(), kKept(), 3); }, "[S, k]");
  const MoePermutation p = moe_permute(tokens, kIndices(), kKept(), 3);
  throws_with([&] { moe_unpermute(p.rows, at::rand({4, 3}), p); }, "weights [S, k]");
  throws_with([&] { moe_unpermute(p.rows, at::rand({4, 2}, at::kDouble), p); }, "fp32 weights");
  throws_with([&] { moe_unpermute(at::randn({7, 3}), at::rand({4, 2}), p); }, "at most");
}

}  // namespace
