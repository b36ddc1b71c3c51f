// The experts' weight gradient by cuBLAS's grouped GEMM and by a GEMM per expert
// (ops/grouped_weight_grad.h) against a
// float64 CPU reference of the products per group: bf16 and fp32, 64 experts with empty groups
// and padding rows, overwriting and accumulating into a slot; then ops::grouped_mm on the GPU
// with a gradient destination (the counts copied to the host in forward) writing there over two
// backwards, autograd's gradient left undefined, or returned to autograd where the GEMMs per
// expert would not pay. Skips without a GPU.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "dscpp/ops/grad_destination.h"
#include "dscpp/ops/grouped_mm.h"
#include "dscpp/ops/grouped_weight_grad.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::test::rel_err;

at::Tensor reference(const at::Tensor& rows, const at::Tensor& grad,
                     const std::vector<int64_t>& counts) {
  const at::Tensor r = rows.cpu().to(at::kDouble), g = grad.cpu().to(at::kDouble);
  at::Tensor dw =
      at::zeros({static_cast<int64_t>(counts.size()), r.size(1), g.size(1)}, at::kDouble);
  int64_t o = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    dw[static_cast<int64_t>(e)] =
        at::matmul(r.narrow(0, o, counts[e]).t(), g.narrow(0, o, counts[e]));
    o += counts[e];
  }
  return dw;
}

std::vector<int64_t> random_counts(int64_t experts, int64_t rows) {
  // Uneven groups, every fifth empty, summing to at most rows.
  const at::Tensor w = at::rand({experts}, at::kDouble) + 0.1;
  std::vector<int64_t> c(experts);
  int64_t sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    c[e] = e % 5 == 4 ? 0 : static_cast<int64_t>(w[e].item<double>() * rows / (0.6 * experts));
    sum += c[e];
  }
  while (sum > rows) {
    for (auto& x : c) x = x / 2;
    sum = 0;
    for (int64_t x : c) sum += x;
  }
  return c;
}

TEST(GroupedWeightGradCuda, BothKernelsMatchTheProductsOfEachGroup) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(5);
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    const int64_t experts = 64, n = 4096, in = 128, out = 256;
    const std::vector<int64_t> counts = random_counts(experts, n - 16);
    const at::Tensor rows = at::randn({n, in}, opts), grad = at::randn({n, out}, opts);
    const at::Tensor before = at::randn({experts, in, out}, opts);
    ASSERT_TRUE(dscpp::ops::grouped_weight_grad_uses_cublas(before, rows, grad));
    const at::Tensor want = reference(rows, grad, counts);
    const double tol = dtype == at::kBFloat16 ? 1e-2 : 1e-5;
    using dscpp::ops::WeightGradKernel;
    for (const auto kernel : {WeightGradKernel::kGrouped, WeightGradKernel::kLoop})
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(fmt::format("{} accumulate {} {}", c10::toString(dtype), accumulate,
                                 kernel == WeightGradKernel::kGrouped ? "grouped" : "loop"));
        at::Tensor slot = before.clone();
        dscpp::ops::grouped_weight_grad_into(slot, rows, grad, counts, accumulate, kernel);
        const at::Tensor expected = accumulate ? want + before.cpu().to(at::kDouble) : want;
        EXPECT_LT(rel_err(slot.cpu().to(at::kDouble), expected), tol);
        // The empty groups: zero when overwriting, untouched when accumulating.
        EXPECT_TRUE(
            at::equal(slot[4].cpu(), accumulate ? before[4].cpu() : at::zeros_like(slot[4]).cpu()));
      }
  }
}

// In the mode auto: where 4 of 16 experts got rows the GEMMs per expert pay
// and write into the destination over two backwards; with every expert busy at this narrow
// width they do not, and the gradient goes back to autograd (per_expert_gemm_pays).
TEST(GroupedWeightGradCuda, GroupedMmWritesIntoItsDestinationOnTheGpu) {
  DSCPP_SKIP_WITHOUT_CUDA();
  dscpp::ops::set_grouped_weight_grad_mode(dscpp::ops::parse_grouped_weight_grad_mode("auto"));
  at::manual_seed(6);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const int64_t experts = 16, n = 1024, in = 64, out = 128;
  for (const bool concentrated : {true, false}) {
    SCOPED_TRACE(concentrated ? "4 experts busy" : "every expert busy");
    const at::Tensor weights = at::randn({experts, in, out}, opts).requires_grad_(true);
    at::Tensor slot = at::full({experts, in, out}, 3.0, opts);  // stale until overwritten
    bool dirty = false;
    int writes = 0;
    dscpp::ops::GradDestination d;
    d.slot = [&](bool& accumulate) {
      accumulate = dirty;
      return slot;
    };
    d.written = [&] {
      dirty = true;
      ++writes;
    };
    const auto handle = dscpp::ops::register_grad_destinations({weights}, {d});
    at::Tensor want = at::zeros({experts, in, out}, at::kDouble);
    for (int micro = 0; micro < 2; ++micro) {
      std::vector<int64_t> counts(experts, n / experts);
      if (concentrated)
        for (int64_t e = 0; e < experts; ++e) counts[e] = e % 4 == micro ? n / 4 : 0;
      const at::Tensor c = at::tensor(counts, at::kLong).to(at::kCUDA);
      const at::Tensor rows = at::randn({n, in}, opts), grad = at::randn({n, out}, opts);
      dscpp::ops::grouped_mm(rows, weights, c).backward(grad);
      want += reference(rows, grad, counts);
    }
    if (concentrated) {
      EXPECT_EQ(writes, 2);
      EXPECT_FALSE(weights.grad().defined());
      // Experts 2 and 3 got no rows in either backward: overwritten with zeros by the first.
      EXPECT_LT(rel_err(slot.cpu().to(at::kDouble), want), 2e-2);
    } else {
      EXPECT_EQ(writes, 0);
      ASSERT_TRUE(weights.grad().defined());
      EXPECT_LT(rel_err(weights.grad().cpu().to(at::kDouble), want), 2e-2);
    }
  }
}

}  // namespace
