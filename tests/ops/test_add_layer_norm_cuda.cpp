// The residual add + LayerNorm CUDA kernels against the float64 formulas
// (tests/ops/add_layer_norm_reference.h): odd hidden sizes (n not a multiple of the 16-byte
// pack), one row and many (20000 x 64 and 2000 x 1024: more rows than the backward's blocks on
// GPUs of up to 250 SMs, an H200 has 132, so blocks take several), hidden up to the backward's
// widest, 8192, and 8184 (a last warp partly idle), fp32, bf16 and fp16, arrays on and off
// 16-byte boundaries, every output poisoned with NaN first; at hidden 1 in fp32 dx is dh
// exactly. Then the op through autograd on CUDA leaves, with h's gradient absent and present,
// and at hidden 8200, where the backward takes ATen's kernels. Skips without a GPU.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/kernel_launch.h"
#include "tests/ops/add_layer_norm_reference.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

namespace kc = dscpp::ops::cuda;
using dscpp::ops::add_layer_norm;
using dscpp::ops::test::add_layer_norm_reference;
using dscpp::ops::test::current_stream;
using dscpp::ops::test::has_nan;
using dscpp::ops::test::placed;
using dscpp::ops::test::poison_allocator;
using dscpp::ops::test::poisoned;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

struct Dtype {
  at::ScalarType type;
  kc::DType tag;
  double tol;  // on ||out - ref|| / ||ref||: the output's rounding, and fp32 arithmetic
};
const std::vector<Dtype> kDtypes = {{at::kFloat, kc::DType::kFloat32, 1e-5},
                                    {at::kBFloat16, kc::DType::kBFloat16, 1e-2},
                                    {at::kHalf, kc::DType::kFloat16, 2e-3}};

TEST(AddLayerNormCuda, KernelsMatchFloat64ReferenceAndWriteEveryElement) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(41);
  const double eps = 1e-5;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1},      {1, 8},     {3, 13},      {7, 1001},  {513, 24},
      {20000, 64}, {64, 2048}, {2000, 1024}, {37, 8192}, {5, 8184}};
  for (const Dtype& d : kDtypes)
    for (const auto& [rows, n] : shapes)
      for (int64_t offset : {0, 1})
        for (bool with_dh : {true, false}) {
          SCOPED_TRACE(fmt::format("{} rows={} n={} offset={} dh={}", c10::toString(d.type), rows,
                                   n, offset, with_dh));
          const at::Tensor x = placed(randn64({rows, n}, 2.0).to(d.type), offset);
          const at::Tensor br = placed(randn64({rows, n}).to(d.type), offset);
          const at::Tensor w = placed(randn64({n}, 0.5).add_(1.0).to(d.type));
          const at::Tensor b = placed(randn64({n}, 0.5).to(d.type));
          const at::Tensor dy = placed(randn64({rows, n}).to(d.type), offset);
          const at::Tensor dh =
              with_dh ? placed(randn64({rows, n}).to(d.type), offset) : at::Tensor();
          at::Tensor h = poisoned({rows, n}, d.type, offset);
          at::Tensor y = poisoned({rows, n}, d.type, offset);
          at::Tensor mean = poisoned({rows}, at::kFloat), rstd = poisoned({rows}, at::kFloat);
          at::Tensor dx = poisoned({rows, n}, d.type, offset);
          at::Tensor dw = poisoned({n}, d.type), db = poisoned({n}, d.type);
          at::Tensor ws = poisoned({kc::add_layer_norm_backward_workspace(rows, n)}, at::kFloat);
          kc::launch_add_layer_norm_forward(x.data_ptr(), br.data_ptr(), w.data_ptr(), b.data_ptr(),
                                            h.data_ptr(), y.data_ptr(), mean.data_ptr<float>(),
                                            rstd.data_ptr<float>(), rows, n, eps, d.tag,
                                            current_stream());
          kc::launch_add_layer_norm_backward(
              dy.data_ptr(), with_dh ? dh.data_ptr() : nullptr, h.data_ptr(), w.data_ptr(),
              mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr(), dw.data_ptr(),
              db.data_ptr(), ws.data_ptr<float>(), rows, n, d.tag, current_stream());
          // h: x + branch rounded once (exact in fp32 for these dtypes, then one rounding).
          const at::Tensor h_ref =
              x.to(at::kCPU, at::kDouble).add(br.to(at::kCPU, at::kDouble)).to(d.type);
          EXPECT_TRUE(h.cpu().equal(h_ref)) << "h";
          const auto ref = add_layer_norm_reference(h_ref, w, b, eps, dh, dy);
          EXPECT_FALSE(has_nan(y)) << "y has unwritten elements";
          EXPECT_FALSE(has_nan(dx)) << "dx has unwritten elements";
          EXPECT_FALSE(has_nan(dw)) << "dweight has unwritten elements";
          EXPECT_FALSE(has_nan(db)) << "dbias has unwritten elements";
          EXPECT_LT(rel_err(y, ref.y), d.tol) << "y";
          EXPECT_LT(rel_err(dx, ref.dx), d.tol) << "dx";
          EXPECT_LT(rel_err(dw, ref.dweight), d.tol) << "dweight";
          EXPECT_LT(rel_err(db, ref.dbias), d.tol) << "dbias";
          if (n == 1 && d.type == at::kFloat) {  // the LayerNorm's gradient is 0 there
            EXPECT_TRUE(dx.cpu().equal(with_dh ? dh.cpu() : at::zeros({rows, n}, at::kFloat)))
                << "hidden 1: dx is dh exactly";
          }
        }
}

// Rows wider than the backward kernel's registers are refused by name (the op sends them to
// ATen, see OpGradientsThroughAutogradMatchReference's hidden 8200).
TEST(AddLayerNormCuda, BackwardLauncherRefusesRowsAboveItsWidest) {
  DSCPP_SKIP_WITHOUT_CUDA();
  const int64_t n = kc::kAddLayerNormBackwardMaxN + 8;
  try {
    kc::launch_add_layer_norm_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                       nullptr, nullptr, nullptr, nullptr, 2, n,
                                       kc::DType::kBFloat16, current_stream());
    ADD_FAILURE() << "expected a refusal";
  } catch (const dscpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden size 8200"), std::string::npos) << e.what();
  }
}

// The op on CUDA leaves through autograd, 3-d x: h, y and the four gradients against the
// reference, with both outputs used and with only y used; a zero-row x gives zero dweight.
TEST(AddLayerNormCuda, OpGradientsThroughAutogradMatchReference) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(42);
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 7, 1000}, {3, 5, 2048}, {0, 64}, {2, 3, 8200}};
  for (const Dtype& d : kDtypes)
    for (const auto& shape : shapes)
      for (bool use_h : {true, false}) {
        SCOPED_TRACE(fmt::format("{} shape={} use_h={}", c10::toString(d.type),
                                 fmt::join(shape, "x"), use_h));
        const int64_t n = shape.back();
        const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(d.type);
        const at::Tensor x = randn64(shape, 2.0).to(cuda).requires_grad_();
        const at::Tensor br = randn64(shape).to(cuda).requires_grad_();
        const at::Tensor w = randn64({n}, 0.5).add_(1.0).to(cuda).requires_grad_();
        const at::Tensor b = randn64({n}, 0.5).to(cuda).requires_grad_();
        const at::Tensor dh = randn64(shape).to(cuda), dy = randn64(shape).to(cuda);
        poison_allocator(8 * x.numel() * 4 + (1 << 22));
        auto [h, y] = add_layer_norm(x, br, w, b, 1e-5);
        at::Tensor loss = y.mul(dy).sum();
        if (use_h) loss = loss.add(h.mul(dh).sum());
        loss.backward();
        const auto ref = add_layer_norm_reference(h, w, b, 1e-5, use_h ? dh : at::Tensor(), dy);
        EXPECT_EQ(y.scalar_type(), d.type);
        EXPECT_EQ(x.grad().scalar_type(), d.type);
        EXPECT_EQ(w.grad().scalar_type(), d.type);
        EXPECT_LT(rel_err(y, ref.y), d.tol) << "y";
        EXPECT_LT(rel_err(x.grad(), ref.dx), d.tol) << "dx";
        EXPECT_LT(rel_err(br.grad(), ref.dx), d.tol) << "dbranch";
        EXPECT_LT(rel_err(w.grad(), ref.dweight), d.tol) << "dweight";
        EXPECT_LT(rel_err(b.grad(), ref.dbias), d.tol) << "dbias";
      }
}

// float64 on a GPU stays on the ATen path and agrees with it.
TEST(AddLayerNormCuda, Float64TakesTheAtenPath) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(43);
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kDouble);
  const at::Tensor x = randn64({5, 9}).to(cuda), br = randn64({5, 9}).to(cuda);
  const at::Tensor w = randn64({9}).to(cuda), b = randn64({9}).to(cuda);
  auto [h, y] = add_layer_norm(x, br, w, b, 1e-5);
  const auto ref = add_layer_norm_reference(h, w, b, 1e-5, at::Tensor(), at::Tensor());
  EXPECT_LT(rel_err(y, ref.y), 1e-12);
}

}  // namespace
