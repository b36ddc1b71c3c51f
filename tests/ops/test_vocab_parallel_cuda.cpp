// The vocabulary-parallel cross entropy's CUDA kernels (ops/vocab_parallel_kernels.h) on
// shards of one logit matrix with the group's reductions made by hand (the MAX and SUM a model
// group would do), against float64 logsumexp - target logit and softmax - onehot; shard widths
// on and off the 16-byte pack, fp32, bf16 and fp16. Then nn::vocab_parallel_cross_entropy on
// CUDA with a one-rank group (t = 1) through autograd. Skips without a GPU.
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/softmax.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "dscpp/nn/vocab_parallel_cross_entropy.h"
#include "dscpp/ops/vocab_parallel_kernels.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

namespace vp = dscpp::ops::vocab_parallel;
using dscpp::ops::test::has_nan;
using dscpp::ops::test::randn64;
using dscpp::ops::test::rel_err;

struct Reference {
  at::Tensor loss, grad;  // [rows], [rows, V], float64 on the CPU
};

Reference reference(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& g) {
  const at::Tensor x = logits.to(at::kCPU, at::kDouble);
  const at::Tensor t = targets.to(at::kCPU);
  const at::Tensor loss = at::logsumexp(x, {1}).sub(x.gather(1, t.unsqueeze(1)).squeeze(1));
  at::Tensor grad = at::softmax(x, 1);
  grad.scatter_add_(1, t.unsqueeze(1), at::full({x.size(0), 1}, -1.0, x.options()));
  return {loss, grad.mul(g.to(at::kCPU, at::kDouble).unsqueeze(1))};
}

TEST(VocabParallelCuda, ShardKernelsWithHandMadeReductionsMatchFloat64) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(51);
  struct Dtype {
    at::ScalarType type;
    double tol;
  };
  for (const Dtype d :
       {Dtype{at::kFloat, 1e-5}, Dtype{at::kBFloat16, 1e-2}, Dtype{at::kHalf, 2e-3}})
    for (const int64_t shards : {1, 2, 3})
      for (const auto& [rows, part] :
           std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {5, 1001}, {67, 1024}, {9, 25152}}) {
        SCOPED_TRACE(
            fmt::format("{} shards={} rows={} part={}", c10::toString(d.type), shards, rows, part));
        const int64_t vocab = shards * part;
        const auto cuda = at::TensorOptions().device(at::kCUDA);
        const at::Tensor logits = randn64({rows, vocab}, 3.0).to(cuda.dtype(d.type));
        const at::Tensor targets = at::randint(vocab, {rows}, cuda.dtype(at::kLong));
        const at::Tensor g = randn64({rows}).to(cuda.dtype(at::kFloat));
        std::vector<at::Tensor> shard(shards);
        at::Tensor gmax;
        for (int64_t s = 0; s < shards; ++s) {
          shard[s] = logits.narrow(1, s * part, part).contiguous();
          const at::Tensor m = vp::row_max(shard[s]);
          gmax = s == 0 ? m : at::maximum(gmax, m);  // all-reduce(MAX) by hand
        }
        at::Tensor total;
        for (int64_t s = 0; s < shards; ++s) {
          const at::Tensor part_sums = vp::sums(shard[s], targets, s * part, gmax);
          total = s == 0 ? part_sums : total.add(part_sums);  // all-reduce(SUM) by hand
        }
        const at::Tensor sum_exp = total.select(0, 0).contiguous();
        const at::Tensor loss = sum_exp.log().sub(total.select(0, 1));
        const Reference ref = reference(logits, targets, g);
        EXPECT_LT(rel_err(loss, ref.loss), d.tol) << "loss";
        for (int64_t s = 0; s < shards; ++s) {
          const at::Tensor dx = vp::grad(g, shard[s], targets, s * part, gmax, sum_exp);
          EXPECT_EQ(dx.scalar_type(), d.type);
          EXPECT_FALSE(has_nan(dx)) << "shard " << s;
          EXPECT_LT(rel_err(dx, ref.grad.narrow(1, s * part, part)), d.tol) << "grad shard " << s;
        }
      }
}

// t = 1 (no group): nn's op takes the kernels on CUDA, 3-d logits, through autograd.
TEST(VocabParallelCuda, OneRankGroupThroughAutogradMatchesFloat64) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(52);
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(type));
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    const at::Tensor logits = randn64({2, 7, 1000}, 3.0).to(cuda.dtype(type)).requires_grad_();
    const at::Tensor targets = at::randint(1000, {2, 7}, cuda.dtype(at::kLong));
    const at::Tensor g = randn64({2, 7}).to(cuda.dtype(at::kFloat));
    const at::Tensor loss = dscpp::nn::vocab_parallel_cross_entropy(logits, targets, nullptr);
    EXPECT_EQ(loss.sizes(), targets.sizes());
    loss.backward(g);
    const Reference ref =
        reference(logits.detach().reshape({14, 1000}), targets.reshape({14}), g.reshape({14}));
    const double tol = type == at::kFloat ? 1e-5 : 1e-2;
    EXPECT_LT(rel_err(loss.reshape({14}), ref.loss), tol);
    EXPECT_EQ(logits.grad().scalar_type(), type);
    EXPECT_LT(rel_err(logits.grad().reshape({14, 1000}), ref.grad), tol);
  }
}

}  // namespace
