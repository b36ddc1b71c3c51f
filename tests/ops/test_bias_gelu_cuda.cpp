// The bias + GeLU CUDA kernels against a float64 CPU reference: fresh random inputs, odd
// widths (n not a multiple of the 16-byte pack), single rows and many, fp32, bf16 and fp16,
// both GeLU forms, arrays on and off 16-byte boundaries, every output (and dbias's workspace)
// poisoned with NaN first. Then the op through autograd on CUDA leaves, and the saved bias
// following set_data. Skips without a GPU.
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/sum.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/kernel_launch.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

namespace kc = dscpp::ops::cuda;
using dscpp::ops::bias_gelu;
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

struct Reference {
  at::Tensor y, dx, dbias;
};

// float64 on the CPU from the values the kernel saw (already rounded to their dtype).
Reference reference(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& grad,
                    bool tanh) {
  const at::Tensor x64 = x.detach().to(at::kCPU, at::kDouble);
  const at::Tensor z = x64.add(bias.detach().to(at::kCPU, at::kDouble));
  const char* approximate = tanh ? "tanh" : "none";
  const at::Tensor dz = at::gelu_backward(grad.to(at::kCPU, at::kDouble), z, approximate);
  return {at::gelu(z, approximate), dz, at::sum(dz.reshape({-1, bias.size(0)}), {0})};
}

TEST(BiasGeluCuda, KernelsMatchFloat64ReferenceAndWriteEveryElement) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(21);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 8}, {3, 13}, {7, 1001}, {513, 24}, {64, 8192}, {513, 4104}, {1, 8200}};
  for (const Dtype& d : kDtypes)
    for (bool tanh : {false, true})
      for (const auto& [rows, n] : shapes)
        for (int64_t offset : {0, 1}) {
          SCOPED_TRACE(fmt::format("{} tanh={} rows={} n={} offset={}", c10::toString(d.type), tanh,
                                   rows, n, offset));
          const at::Tensor x = placed(randn64({rows, n}, 2.0).to(d.type), offset);
          const at::Tensor b = placed(randn64({n}).to(d.type), 1);  // bias: any alignment
          const at::Tensor g = placed(randn64({rows, n}).to(d.type), offset);
          at::Tensor y = poisoned({rows, n}, d.type, offset);
          at::Tensor dx = poisoned({rows, n}, d.type, offset);
          at::Tensor db = poisoned({n}, d.type);
          at::Tensor ws = poisoned({kc::bias_gelu_partial_rows(rows, n, d.tag) * n}, at::kFloat);
          kc::launch_bias_gelu_forward(x.data_ptr(), b.data_ptr(), y.data_ptr(), rows, n, d.tag,
                                       tanh, current_stream());
          kc::launch_bias_gelu_backward(g.data_ptr(), x.data_ptr(), b.data_ptr(), dx.data_ptr(),
                                        db.data_ptr(), ws.data_ptr<float>(), rows, n, d.tag, tanh,
                                        current_stream());
          const Reference ref = reference(x, b, g, tanh);
          EXPECT_FALSE(has_nan(y)) << "y has unwritten elements";
          EXPECT_FALSE(has_nan(dx)) << "dx has unwritten elements";
          EXPECT_FALSE(has_nan(db)) << "dbias has unwritten elements";
          EXPECT_LT(rel_err(y, ref.y), d.tol) << "y";
          EXPECT_LT(rel_err(dx, ref.dx), d.tol) << "dx";
          EXPECT_LT(rel_err(db, ref.dbias), d.tol) << "dbias";
        }
}

// dx null: only dbias; dbias null: only dx (and the workspace is not touched).
TEST(BiasGeluCuda, BackwardWritesOnlyWhatIsAskedFor) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(22);
  const int64_t rows = 33, n = 1024;
  const at::Tensor x = placed(randn64({rows, n}).to(at::kBFloat16));
  const at::Tensor b = placed(randn64({n}).to(at::kBFloat16));
  const at::Tensor g = placed(randn64({rows, n}).to(at::kBFloat16));
  const Reference ref = reference(x, b, g, false);
  at::Tensor db = poisoned({n}, at::kBFloat16);
  at::Tensor ws =
      poisoned({kc::bias_gelu_partial_rows(rows, n, kc::DType::kBFloat16) * n}, at::kFloat);
  kc::launch_bias_gelu_backward(g.data_ptr(), x.data_ptr(), b.data_ptr(), nullptr, db.data_ptr(),
                                ws.data_ptr<float>(), rows, n, kc::DType::kBFloat16, false,
                                current_stream());
  EXPECT_LT(rel_err(db, ref.dbias), 1e-2);
  at::Tensor dx = poisoned({rows, n}, at::kBFloat16);
  kc::launch_bias_gelu_backward(g.data_ptr(), x.data_ptr(), b.data_ptr(), dx.data_ptr(), nullptr,
                                nullptr, rows, n, kc::DType::kBFloat16, false, current_stream());
  EXPECT_LT(rel_err(dx, ref.dx), 1e-2);
}

// The op on CUDA leaves through autograd: y, x.grad and bias.grad against the reference, for
// 3-d x and a zero-row x (dbias then 0).
TEST(BiasGeluCuda, OpGradientsThroughAutogradMatchReference) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(23);
  const std::vector<std::vector<int64_t>> shapes = {{2, 7, 1000}, {3, 5, 1001}, {0, 64}};
  for (const Dtype& d : kDtypes)
    for (const auto& shape : shapes) {
      SCOPED_TRACE(fmt::format("{} shape={}", c10::toString(d.type), fmt::join(shape, "x")));
      const int64_t n = shape.back();
      const auto cuda = at::TensorOptions().device(at::kCUDA);
      const at::Tensor x = randn64(shape, 2.0).to(cuda.dtype(d.type)).requires_grad_();
      const at::Tensor b = randn64({n}).to(cuda.dtype(d.type)).requires_grad_();
      const at::Tensor g = randn64(shape).to(cuda.dtype(d.type));
      poison_allocator(4 * x.numel() * 4 + (1 << 22));
      const at::Tensor y = bias_gelu(x, b, true);
      y.backward(g);
      const Reference ref = reference(x, b, g, true);
      EXPECT_EQ(y.scalar_type(), d.type);
      EXPECT_EQ(x.grad().scalar_type(), d.type);
      EXPECT_EQ(b.grad().scalar_type(), d.type);
      EXPECT_LT(rel_err(y, ref.y), d.tol) << "y";
      EXPECT_LT(rel_err(x.grad(), ref.dx), d.tol) << "dx";
      EXPECT_LT(rel_err(b.grad(), ref.dbias), d.tol) << "dbias";
    }
}

// As on the CPU: a bias released and re-gathered (set_data) between forward and backward is
// read as it is at backward time.
TEST(BiasGeluCuda, BackwardReadsTheBiasAsSetDataLeftIt) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(24);
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor x = randn64({16, 256}, 2.0).to(bf16).requires_grad_();
  const at::Tensor bias = randn64({256}).to(bf16).requires_grad_();
  const at::Tensor gathered = randn64({256}).to(bf16);
  const at::Tensor y = bias_gelu(x, bias, false);
  {
    const c10::NoGradGuard no_grad;
    bias.set_data(at::empty({0}, bias.options()));
    bias.set_data(gathered.clone());
  }
  const at::Tensor g = randn64({16, 256}).to(bf16);
  y.backward(g);
  const Reference ref = reference(x, gathered, g, false);
  EXPECT_LT(rel_err(x.grad(), ref.dx), 1e-2);
  EXPECT_LT(rel_err(bias.grad(), ref.dbias), 1e-2);
}

// float64, and x and bias of different dtypes, stay on the ATen path on a GPU too.
TEST(BiasGeluCuda, OtherDtypesTakeTheAtenPath) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(25);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = randn64({5, 9}).to(cuda);
  const at::Tensor b = randn64({9}).to(cuda);
  EXPECT_TRUE(bias_gelu(x, b, false).equal(at::gelu(x.add(b))));
  const at::Tensor xb = x.to(at::kBFloat16);
  const at::Tensor bf = b.to(at::kFloat);
  const at::Tensor y = bias_gelu(xb, bf, true);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_TRUE(y.equal(at::gelu(xb.add(bf), "tanh")));
}

}  // namespace
