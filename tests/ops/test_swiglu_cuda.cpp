// The SwiGLU CUDA kernels against a float64 CPU reference: odd widths (f not a multiple of the
// 16-byte pack), one row and many, [8,192, 2 x 1,024] (moe_1gpu's width; its 65,536 rows cost
// 50 s of float64 on the host), fp32, bf16 and fp16, arrays on and off 16-byte boundaries,
// outputs poisoned with NaN first; then the op through autograd on a CUDA leaf. Skips without a
// GPU.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/kernel_launch.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

namespace kc = dscpp::ops::cuda;
using dscpp::ops::test::current_stream;
using dscpp::ops::test::has_nan;
using dscpp::ops::test::placed;
using dscpp::ops::test::poisoned;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

struct Dtype {
  at::ScalarType type;
  kc::DType tag;
  double tol;  // on ||out - ref|| / ||ref||: the output's one rounding
};
const std::vector<Dtype> kDtypes = {{at::kFloat, kc::DType::kFloat32, 1e-6},
                                    {at::kBFloat16, kc::DType::kBFloat16, 6e-3},
                                    {at::kHalf, kc::DType::kFloat16, 1e-3}};

TEST(SwigluCuda, KernelsMatchFloat64ReferenceAndWriteEveryElement) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(41);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {1, 8},    {3, 13},
                                                           {7, 1001}, {513, 24}, {8192, 1024}};
  for (const Dtype& d : kDtypes)
    for (const auto& [rows, f] : shapes)
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(
            fmt::format("{} rows={} f={} offset={}", c10::toString(d.type), rows, f, offset));
        const at::Tensor x = placed(randn64({rows, 2 * f}, 2.0).to(d.type), offset);
        const at::Tensor dy = placed(randn64({rows, f}).to(d.type), offset);
        at::Tensor y = poisoned({rows, f}, d.type, offset);
        at::Tensor dx = poisoned({rows, 2 * f}, d.type, offset);
        kc::launch_swiglu_forward(x.const_data_ptr(), y.mutable_data_ptr(), rows, f, d.tag,
                                  current_stream());
        kc::launch_swiglu_backward(dy.const_data_ptr(), x.const_data_ptr(), dx.mutable_data_ptr(),
                                   rows, f, d.tag, current_stream());
        const at::Tensor x64 = x.to(at::kCPU, at::kDouble), g64 = dy.to(at::kCPU, at::kDouble);
        const at::Tensor gate = x64.narrow(1, 0, f), up = x64.narrow(1, f, f);
        ASSERT_FALSE(has_nan(y));
        ASSERT_FALSE(has_nan(dx));
        EXPECT_LT(rel_err(y, at::silu(gate) * up), d.tol) << "y";
        const at::Tensor want =
            at::cat({at::silu_backward(g64 * up, gate), g64 * at::silu(gate)}, 1);
        EXPECT_LT(rel_err(dx, want), d.tol) << "dx";
      }
}

TEST(SwigluCuda, AutogradOnACudaLeafMatchesTheReference) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(42);
  const at::Tensor x0 = randn64({4, 9, 64}, 2.0);
  const at::Tensor x = x0.to(at::kCUDA, at::kBFloat16).requires_grad_();
  const at::Tensor g = randn64({4, 9, 32});
  const at::Tensor y = dscpp::ops::swiglu(x);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  ASSERT_EQ(y.sizes(), at::IntArrayRef({4, 9, 32}));
  y.backward(g.to(at::kCUDA, at::kBFloat16));
  const at::Tensor r = x.detach().to(at::kCPU, at::kDouble).requires_grad_();
  const auto halves = r.chunk(2, -1);
  const at::Tensor ref = at::silu(halves[0]) * halves[1];
  ref.backward(g.to(at::kBFloat16).to(at::kDouble));
  EXPECT_LT(rel_err(y, ref), 6e-3);
  EXPECT_LT(rel_err(x.grad(), r.grad()), 6e-3);
}

}  // namespace
