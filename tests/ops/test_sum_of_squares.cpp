// ops::sum_of_squares on the CPU against a float64 sum of the same elements: every floating
// type (16-bit read in place), sizes that end inside a block and inside the lanes, a strided
// view, a result independent of the thread count (to the bit), and a large partition summed
// to fp64-like precision (fp32 sums of the whole run 6% low at 2e8 elements), and the per-
// instruction-set kernels it runs on agree with the portable one.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "dscpp/ops/cpu_adam_kernels.h"
#include "dscpp/ops/sum_of_squares.h"

namespace {

double reference(const at::Tensor& t) {
  return t.to(at::kDouble).square().sum().item<double>();
}

TEST(SumOfSquares, MatchesFloat64OnEveryTypeAndSize) {
  at::manual_seed(5);
  for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16})
    for (int64_t n : {0, 1, 15, 17, 65536, 65536 * 3 + 7}) {
      const at::Tensor x = at::randn({n}).to(type);
      const double want = reference(x);
      const at::Tensor got = dscpp::ops::sum_of_squares(x);
      EXPECT_EQ(got.dim(), 0);
      EXPECT_EQ(got.scalar_type(), at::kFloat);
      EXPECT_NEAR(got.item<double>(), want, 1e-6 * want + 1e-12) << c10::toString(type) << " " << n;
    }
}

TEST(SumOfSquares, StridedViewsAndThreadCountsAgree) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({300, 1000}).to(at::kBFloat16);
  const at::Tensor view = x.t();  // not contiguous
  EXPECT_NEAR(dscpp::ops::sum_of_squares(view).item<double>(), reference(view),
              1e-6 * reference(view));
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const float one = dscpp::ops::sum_of_squares(x).item<float>();
  at::set_num_threads(std::max(2, threads));
  const float many = dscpp::ops::sum_of_squares(x).item<float>();
  at::set_num_threads(threads);
  EXPECT_EQ(one, many);
}

TEST(SumOfSquares, EveryInstructionSetsKernelSumsTheSame) {
  // The table this CPU uses against the portable build of the same loop, on a range that ends
  // inside the lanes (the other tables, where this CPU has them, are what best_table() picks).
  namespace k = dscpp::ops::cpu::kernels;
  at::manual_seed(8);
  for (auto type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor x = at::randn({70001}).to(type);
    const k::Type kt = type == at::kFloat  ? k::Type::kFloat
                       : type == at::kHalf ? k::Type::kHalf
                                           : k::Type::kBFloat16;
    const double best = k::best_table().sum_of_squares(x.data_ptr(), kt, 3, 70001);
    const double portable = k::DEFAULT::table().sum_of_squares(x.data_ptr(), kt, 3, 70001);
    const double want = reference(x.slice(0, 3));
    EXPECT_NEAR(best, want, 1e-12 * want) << c10::toString(type);
    EXPECT_NEAR(portable, want, 1e-12 * want) << c10::toString(type);
  }
}

TEST(SumOfSquares, ALargePartitionKeepsItsPrecision) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({1 << 25}).to(at::kBFloat16);  // 33.5 M elements
  const double want = reference(x);
  EXPECT_NEAR(dscpp::ops::sum_of_squares(x).item<double>(), want, 1e-6 * want);
}

}  // namespace
