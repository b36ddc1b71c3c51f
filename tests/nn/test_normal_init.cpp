// nn::normal_init: the GPT's parallel initialisation.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <cmath>

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
