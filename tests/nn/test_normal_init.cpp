// nn::normal_init: the GPT's parallel initialisation.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/nn/normal_init.h"

// normal_init draws blocks of 2^20 elements in parallel, each from its own generator: the
// result must depend on the seed alone (not the thread count), and the blocks must be
// independent samples of normal(0, std), not copies or shifted streams of one another.
TEST(NormalInit, DependsOnTheSeedNotTheThreads) {
  const int64_t n = 3 * (int64_t{1} << 20) + 12345;  // three whole blocks and a partial one
  const int threads = at::get_num_threads();
  auto draw = [&](uint64_t seed, int nthreads) {
    at::set_num_threads(nthreads);
    at::manual_seed(seed);
    at::Tensor t = at::empty({n}).requires_grad_();  // as a parameter: a leaf
    dscpp::nn::normal_init(t, 0.5);
    t = t.detach();
    return t;
  };
  const at::Tensor one = draw(7, 1), two = draw(7, 2), other = draw(8, 2);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(one, two));
  EXPECT_FALSE(at::equal(one, other));
  EXPECT_NEAR(one.std().item<double>(), 0.5, 0.5 * 0.01);  // 3.1 M samples: spread ~0.04%
  EXPECT_NEAR(one.mean().item<double>(), 0.0, 0.5 * 0.01);
  // Two blocks: uncorrelated (|r| ~ 1e-3 for 2^20 pairs), whatever the alignment.
  const int64_t block = int64_t{1} << 20;
  const at::Tensor a = one.narrow(0, 0, block), b = one.narrow(0, block, block);
  for (int64_t shift : {0, 1, 2}) {
    const at::Tensor x = a.narrow(0, 0, block - 2), y = b.narrow(0, shift, block - 2);
    const double r = ((x * y).mean() / (x.std() * y.std())).item<double>();
    EXPECT_LT(std::abs(r), 0.01) << "shift " << shift;
  }
}

// The expert-major variants: expert g's values come from (the seed, g) alone. Two expert-parallel
// ranks holding experts [0, 2) and [2, 4) draw exactly the halves of the one-rank tensor [4, ...],
// and the default generator is left where the one-rank draw leaves it (what is built next does
// not depend on the degree). Experts differ from one another, and the thread count does not
// matter. normal and uniform alike; a bf16 tensor gets the fp32 values rounded.
TEST(NormalInit, ExpertsDependOnTheirGlobalIdNotTheDegree) {
  const int threads = at::get_num_threads();
  using Init = void (*)(const at::Tensor&, double, int64_t);
  for (Init init :
       {Init(&dscpp::nn::normal_init_experts), Init(&dscpp::nn::uniform_init_experts)}) {
    // [experts, 300, 700]: 210,000 elements each, a part of a block; 5 x 1.1 M: more than one.
    for (const int64_t rows : {int64_t{300}, int64_t{1600}}) {
      const std::vector<int64_t> shape = {rows, 700};
      auto draw = [&](int64_t experts, int64_t first, int nthreads, at::Tensor* after) {
        at::set_num_threads(nthreads);
        at::manual_seed(11);
        std::vector<int64_t> sizes = {experts};
        sizes.insert(sizes.end(), shape.begin(), shape.end());
        at::Tensor t = at::empty(sizes).requires_grad_();
        init(t, 0.25, first);
        if (after) *after = at::rand({4});  // the default generator's next values
        return t.detach();
      };
      at::Tensor after_one, after_a, after_b;
      const at::Tensor one = draw(4, 0, 2, &after_one);
      const at::Tensor a = draw(2, 0, 1, &after_a), b = draw(2, 2, 2, &after_b);
      EXPECT_TRUE(at::equal(one.narrow(0, 0, 2), a)) << rows;
      EXPECT_TRUE(at::equal(one.narrow(0, 2, 2), b)) << rows;
      EXPECT_TRUE(at::equal(after_one, after_a) && at::equal(after_one, after_b)) << rows;
      EXPECT_TRUE(at::equal(draw(1, 3, 1, nullptr)[0], one[3])) << rows;
      EXPECT_FALSE(at::equal(one[0], one[1])) << rows;
      at::Tensor plain = at::empty(one.sizes());
      at::manual_seed(11);
      dscpp::nn::normal_init(plain, 0.25);
      EXPECT_FALSE(at::equal(plain[0], one[0])) << "expert 0 is not the plain draw's first block";
      // bf16 (drawn in fp32, then rounded), and a non-contiguous view, through the host copy.
      at::manual_seed(11);
      at::Tensor half = at::empty(one.sizes(), at::TensorOptions(at::kBFloat16));
      init(half, 0.25, 0);
      EXPECT_TRUE(at::equal(half, one.to(at::kBFloat16))) << rows;
      at::manual_seed(11);
      at::Tensor wide = at::zeros({4, rows, 1400});
      init(wide.narrow(2, 0, 700), 0.25, 0);
      EXPECT_TRUE(at::equal(wide.narrow(2, 0, 700), one)) << rows;
    }
  }
  at::set_num_threads(threads);
  // The spread: normal(0, std), and U(-bound, bound) of std bound / sqrt(3).
  at::manual_seed(3);
  at::Tensor n = at::empty({8, 512, 512}), u = at::empty({8, 512, 512});
  dscpp::nn::normal_init_experts(n, 0.5, 5);
  dscpp::nn::uniform_init_experts(u, 0.5, 5);
  EXPECT_NEAR(n.std().item<double>(), 0.5, 0.5 * 0.01);
  EXPECT_NEAR(u.std().item<double>(), 0.5 / std::sqrt(3.0), 0.01);
  EXPECT_LE(u.abs().max().item<double>(), 0.5);
  EXPECT_THROW(dscpp::nn::normal_init_experts(n, 0.5, -1), dscpp::Error);
}
