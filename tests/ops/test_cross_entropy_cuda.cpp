// The cross-entropy CUDA kernels against a float64 CPU reference: fresh random inputs, the
// GPT's vocabulary (50304) and an odd one (1001), 1 to 513 rows, fp32, bf16 and fp16, ignored
// rows, -inf logits and rows far from 0, logits on and off 16-byte boundaries (and a dlogits
// at another offset, the unaligned path), every output poisoned with NaN first. Then the op
// through autograd, every row ignored, a target out of range. Skips without a GPU.
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/where.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/kernel_launch.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

namespace kc = dscpp::ops::cuda;
using dscpp::ops::cross_entropy;
using dscpp::ops::test::current_stream;
using dscpp::ops::test::has_nan;
using dscpp::ops::test::placed;
using dscpp::ops::test::poison_allocator;
using dscpp::ops::test::poisoned;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

constexpr int64_t kIgnore = -100;
// The loss and log-sum-exps come from exactly representable inputs through fp32 arithmetic.
constexpr double kLossTol = 1e-5;

struct Dtype {
  at::ScalarType type;
  kc::DType tag;
  double tol;  // dlogits: its rounding to the dtype, and fp32 arithmetic
};
const std::vector<Dtype> kDtypes = {{at::kFloat, kc::DType::kFloat32, 1e-5},
                                    {at::kBFloat16, kc::DType::kBFloat16, 1e-2},
                                    {at::kHalf, kc::DType::kFloat16, 2e-3}};

// Logits of scale 3, every fifth row moved by +40 (the online max must rescale), a few -inf
// (masked classes) in row 0; targets uniform, every third row ignored when there are several.
at::Tensor make_logits(int64_t rows, int64_t vocab, at::ScalarType type) {
  at::Tensor x = randn64({rows, vocab}, 3.0);
  for (int64_t r = 0; r < rows; r += 5) x[r].add_(40.0);
  if (vocab > 4) x[0].narrow(0, 1, 3).fill_(-std::numeric_limits<double>::infinity());
  return x.to(type);
}

at::Tensor make_targets(int64_t rows, int64_t vocab) {
  at::Tensor t = at::randint(vocab, {rows}, at::kLong);
  if (vocab > 4) t[0] = 0;  // row 0's target is not a masked class
  if (rows > 1)
    for (int64_t r = 1; r < rows; r += 3) t[r] = kIgnore;
  return t;
}

struct Reference {
  at::Tensor loss, lse, count, dlogits;  // lse 0 on ignored rows, as the kernel writes it
};

Reference reference(const at::Tensor& logits, const at::Tensor& targets, double grad) {
  const at::Tensor x = logits.detach().to(at::kCPU, at::kDouble);
  const at::Tensor t = targets.to(at::kCPU);
  const at::Tensor counted = t.ne(kIgnore);
  const at::Tensor index = at::where(counted, t, 0).unsqueeze(1);
  const at::Tensor lse = at::logsumexp(x, {1});
  const at::Tensor row_loss = at::where(counted, lse.sub(x.gather(1, index).squeeze(1)), 0);
  const at::Tensor count = counted.sum().to(at::kDouble);
  at::Tensor d = at::exp(x.sub(lse.unsqueeze(1)));
  d.scatter_add_(1, index, at::full({x.size(0), 1}, -1.0, d.options()));
  d = at::where(counted.unsqueeze(1), d.mul(count.reciprocal().mul(grad)), 0);
  return {row_loss.sum().div(count), at::where(counted, lse, 0), count, d};
}

TEST(CrossEntropyCuda, KernelsMatchFloat64ReferenceAndWriteEveryElement) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(31);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {2, 7}, {1, 1001}, {513, 1001}, {1, 50304}, {7, 50304}, {64, 50304}};
  const double grad = 0.7;
  for (const Dtype& d : kDtypes)
    for (const auto& [rows, vocab] : shapes)
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(fmt::format("{} rows={} vocab={} offset={}", c10::toString(d.type), rows,
                                 vocab, offset));
        const at::Tensor logits = placed(make_logits(rows, vocab, d.type), offset);
        const at::Tensor targets = make_targets(rows, vocab).cuda();
        at::Tensor lse = poisoned({rows}, at::kFloat);
        at::Tensor row_loss = poisoned({rows}, at::kFloat);
        at::Tensor loss = poisoned({}, at::kFloat);
        at::Tensor count = poisoned({}, at::kFloat);
        kc::launch_cross_entropy_forward(logits.data_ptr(), targets.data_ptr<int64_t>(), rows,
                                         vocab, kIgnore, d.tag, lse.data_ptr<float>(),
                                         row_loss.data_ptr<float>(), loss.data_ptr<float>(),
                                         count.data_ptr<float>(), current_stream());
        const Reference ref = reference(logits, targets, grad);
        EXPECT_FALSE(has_nan(lse)) << "lse has unwritten rows";
        EXPECT_LT(rel_err(lse, ref.lse), kLossTol) << "lse";
        EXPECT_LT(rel_err(loss, ref.loss), kLossTol) << "loss";
        EXPECT_EQ(count.item<double>(), ref.count.item<double>()) << "count";

        const at::Tensor g = at::full({}, grad, targets.options().dtype(at::kFloat));
        // The same offset as the logits: packs after a per-row head; another: one by one.
        for (int64_t out_offset : {offset, offset + 1}) {
          SCOPED_TRACE(fmt::format("dlogits offset={}", out_offset));
          at::Tensor dlogits = poisoned({rows, vocab}, d.type, out_offset);
          kc::launch_cross_entropy_backward(g.data_ptr<float>(), logits.data_ptr(),
                                            targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                            count.data_ptr<float>(), rows, vocab, kIgnore, d.tag,
                                            dlogits.data_ptr(), current_stream());
          EXPECT_FALSE(has_nan(dlogits)) << "dlogits has unwritten elements";
          EXPECT_LT(rel_err(dlogits, ref.dlogits), d.tol) << "dlogits";
          const at::Tensor ignored = targets.eq(kIgnore).nonzero().squeeze(1);
          if (ignored.numel() > 0) {
            EXPECT_EQ(dlogits.index_select(0, ignored).abs().max().item<double>(), 0.0)
                << "ignored rows' gradient is not 0";
          }
        }
      }
}

// The op on a CUDA leaf through autograd, grad_out other than 1, against the reference and
// against torch's cross_entropy_loss on the logits made fp32 (what GPT::loss computed).
TEST(CrossEntropyCuda, OpGradientThroughAutogradMatchesReference) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(32);
  for (const Dtype& d : kDtypes)
    for (const auto& [rows, vocab] : {std::pair<int64_t, int64_t>{37, 1001}, {5, 50304}}) {
      SCOPED_TRACE(fmt::format("{} rows={} vocab={}", c10::toString(d.type), rows, vocab));
      const at::Tensor x = make_logits(rows, vocab, d.type).cuda().requires_grad_();
      const at::Tensor t = make_targets(rows, vocab).cuda();
      poison_allocator(x.numel() * 8);
      const at::Tensor loss = cross_entropy(x, t);
      EXPECT_EQ(loss.scalar_type(), at::kFloat);
      EXPECT_TRUE(loss.is_cuda());
      loss.mul(1.5).backward();
      const Reference ref = reference(x, t, 1.5);
      EXPECT_LT(rel_err(loss, ref.loss), kLossTol);
      EXPECT_EQ(x.grad().scalar_type(), d.type);
      EXPECT_LT(rel_err(x.grad(), ref.dlogits), d.tol);
      const at::Tensor eager = at::cross_entropy_loss(x.detach().to(at::kFloat), t);
      EXPECT_LT(rel_err(loss, eager), kLossTol) << "against torch's fp32 cross_entropy";
    }
}

TEST(CrossEntropyCuda, EveryRowIgnoredGivesNaNAndZeroGradient) {
  DSCPP_SKIP_WITHOUT_CUDA();
  const at::Tensor x = randn64({4, 1001}).to(at::kCUDA, at::kBFloat16).requires_grad_();
  const at::Tensor t = at::full({4}, kIgnore, x.options().dtype(at::kLong));
  const at::Tensor loss = cross_entropy(x, t);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_EQ(x.grad().abs().max().item<double>(), 0.0);
}

// No device-side assert (which would poison the CUDA context): the loss is NaN instead.
TEST(CrossEntropyCuda, TargetOutOfRangeGivesNaNLoss) {
  DSCPP_SKIP_WITHOUT_CUDA();
  const at::Tensor x = randn64({3, 100}).to(at::kCUDA, at::kFloat);
  at::Tensor t = at::full({3}, 1, x.options().dtype(at::kLong));
  t[1] = 100;
  EXPECT_TRUE(std::isnan(cross_entropy(x, t).item<double>()));
  t[1] = -5;
  EXPECT_TRUE(std::isnan(cross_entropy(x, t).item<double>()));
}

// float64 logits on a GPU take the ATen path.
TEST(CrossEntropyCuda, Float64TakesTheAtenPath) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(33);
  const at::Tensor x = randn64({6, 50}).cuda();
  const at::Tensor t = make_targets(6, 50).cuda();
  const at::Tensor loss = cross_entropy(x, t);
  EXPECT_EQ(loss.scalar_type(), at::kDouble);
  EXPECT_LT(rel_err(loss, at::cross_entropy_loss(x, t)), 1e-14);
}

}  // namespace
