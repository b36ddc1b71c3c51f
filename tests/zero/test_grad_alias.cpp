// The gradient partition as the flat gradient buffer itself (ZeroOptions::alias_grad_partition):
// on one rank at stages 0-1 with accumulation the reduction is the identity, so the partition
// can be the buffer the parameters' .grad are views of. Trained four micro-steps a window, laid
// out by the first backward (a model used in the opposite order of its registration, of odd
// sizes), clipping, an overflow's skipped step: every loss,
// every boundary's gradient partition and every weight equal bit for bit those of the same run
// with two buffers (the alias off: the boundary copies the buffer into its own partition).
// Where the identity is not exact (a communication type, a predivide factor, an fp32 partition
// of 16-bit gradients, offload, two ranks) there is no alias, and a partition forced onto the
// buffer there is refused by name.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/error.h"
#include "dscpp/zero/grad_buckets.h"
#include "dscpp/zero/zero_optimizer.h"

namespace {

using dscpp::zero::GradBuckets;
using dscpp::zero::ZeroOptimizer;
using dscpp::zero::ZeroOptions;

// Parameters of odd sizes, used in the reverse of their registration order (the first layout
// guesses the opposite, so the first backward's layout differs from it).
constexpr int kParams = 6;
const int64_t kSizes[kParams] = {5, 7, 3, 11, 6, 9};
constexpr int64_t kWidth = 4;

struct Window {
  ZeroOptions options;
  at::ScalarType dtype = at::kBFloat16;
  int steps = 4, accumulation = 4;
  int overflow_step = -1;  // this step's last micro-step multiplies its loss by inf
};

struct Result {
  std::vector<double> losses;        // every micro-step
  std::vector<at::Tensor> boundary;  // the gradient partition after each window's backward
  std::vector<at::Tensor> params;    // at the end
  std::vector<bool> applied;         // per step
  bool aliased = false;
};

std::string describe(const Window& r) {
  const auto& o = r.options;
  return "stage " + std::to_string(o.stage) + " " + c10::toString(r.dtype) +
         (o.gradient_clipping > 0 ? " clip" : "") + (o.check_overflow ? " overflow check" : "") +
         (o.overlap_comm ? " overlap" : "") +
         (r.overflow_step >= 0 ? " overflow at " + std::to_string(r.overflow_step) : "");
}

Result train(Window run, bool alias) {
  at::manual_seed(11);
  std::vector<at::Tensor> params;
  for (int i = 0; i < kParams; ++i)
    params.push_back((at::randn({kWidth, kSizes[i]}) * 0.5).to(run.dtype).requires_grad_());
  std::vector<at::Tensor> inputs;
  for (int k = 0; k < run.steps * run.accumulation; ++k)
    inputs.push_back(at::randn({3, kWidth}).to(run.dtype));
  ZeroOptions o = run.options;
  o.reduce_bucket_size = 24;  // one or two parameters a bucket
  o.alignment = 1;
  o.grad_dtype = run.dtype;  // (bf16: DeepSpeed's grad_accum_dtype bf16)
  o.accumulates = run.accumulation > 1;
  o.alias_grad_partition = alias;
  dscpp::OptimizerConfig oc;
  oc.type = "AdamW";
  oc.params = {{"lr", 0.01}, {"weight_decay", 0.1}};
  ZeroOptimizer zo(params, dscpp::optim::make_optimizer(oc), dscpp::comm::make_no_op_group(0, 1),
                   o);
  Result res;
  size_t next = 0;
  for (int s = 0; s < run.steps; ++s) {
    for (int m = 0; m < run.accumulation; ++m) {
      const bool reduce = m == run.accumulation - 1;
      zo.begin_backward(reduce);
      // Registered 0..5, used 5..0: backward makes parameter 0's gradient ready first.
      at::Tensor h = inputs.at(next++);
      for (int i = kParams - 1; i >= 0; --i) {
        h = at::tanh(at::matmul(h, params[i]));
        if (i > 0) h = at::matmul(h, params[i].t()) * 0.5;
      }
      at::Tensor loss = h.to(at::kFloat).pow(2).mean();
      res.losses.push_back(loss.item<double>());
      if (reduce && s == run.overflow_step) loss = loss * std::numeric_limits<float>::infinity();
      (loss / run.accumulation).backward();
      zo.end_backward();
    }
    res.boundary.push_back(zo.grad_partition().clone());
    res.applied.push_back(zo.step(1.0).applied);
  }
  // (asked after training: asked before, the parts would be built on the guessed layout)
  res.aliased = zo.grads_aliased();
  // Laid out by the first backward: parameter 0, ready first, opens the buffer (the guess put
  // parameter 5 there).
  EXPECT_EQ(zo.layout().params[0].offset, 0);
  EXPECT_NE(zo.layout().params[kParams - 1].offset, 0);
  for (const auto& p : params) res.params.push_back(p.detach().clone());
  return res;
}

void expect_same_bits(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t k = 0; k < a.losses.size(); ++k)
    EXPECT_EQ(a.losses[k], b.losses[k]) << what << ": loss of micro-step " << k;
  ASSERT_EQ(a.boundary.size(), b.boundary.size());
  for (size_t s = 0; s < a.boundary.size(); ++s) {
    // (equal() is false for NaN: an overflow's partition is compared by its non-finite places)
    const at::Tensor fa = a.boundary[s].isfinite(), fb = b.boundary[s].isfinite();
    EXPECT_TRUE(fa.equal(fb)) << what << ": step " << s << "'s non-finite gradients";
    EXPECT_TRUE(a.boundary[s].masked_select(fa).equal(b.boundary[s].masked_select(fb)))
        << what << ": step " << s << "'s gradient partition";
    EXPECT_EQ(a.applied[s], b.applied[s]) << what << ": step " << s;
  }
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_TRUE(a.params[i].equal(b.params[i])) << what << ": parameter " << i;
}

TEST(GradAlias, OneRankAccumulationTrainsBitForBitAsTwoBuffers) {
  std::vector<Window> runs;
  for (int stage : {0, 1})
    for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      Window r;
      r.options.stage = stage;
      r.dtype = dtype;
      runs.push_back(r);
      r.options.gradient_clipping = 0.05;  // (the norms here are about 0.1-1: it clips)
      runs.push_back(r);
      r.options.check_overflow = true;
      r.options.overlap_comm = true;
      r.overflow_step = 1;  // skipped: the next window must start from zeros all the same
      runs.push_back(r);
    }
  for (const Window& r : runs) {
    const Result without = train(r, false), with = train(r, true);
    EXPECT_TRUE(with.aliased) << describe(r);
    EXPECT_FALSE(without.aliased) << describe(r);
    expect_same_bits(with, without, describe(r));
    if (r.overflow_step >= 0) {
      EXPECT_FALSE(with.applied[r.overflow_step]) << describe(r);
      EXPECT_TRUE(with.applied[r.overflow_step + 1]) << describe(r);
    }
    // The run trains (not a comparison of two runs that do nothing): the weights moved.
    at::manual_seed(11);
    const at::Tensor first = (at::randn({kWidth, kSizes[0]}) * 0.5).to(r.dtype);
    EXPECT_FALSE(with.params[0].equal(first)) << describe(r);
  }
}

TEST(GradAlias, TheGradientsAreViewsOfThePartitionAndTheBoundaryCopiesNothing) {
  at::manual_seed(3);
  std::vector<at::Tensor> params;
  for (int i = 0; i < 3; ++i) params.push_back(at::randn({8}).to(at::kBFloat16).requires_grad_());
  ZeroOptions o;
  o.stage = 1;
  o.grad_dtype = at::kBFloat16;
  dscpp::OptimizerConfig oc;
  oc.type = "sgd";
  oc.params = {{"lr", 0.1}};
  ZeroOptimizer zo(params, dscpp::optim::make_optimizer(oc), dscpp::comm::make_no_op_group(0, 1),
                   o);
  ASSERT_TRUE(zo.grads_aliased());
  const at::Tensor& part = zo.grad_partition();
  const void* storage = part.storage().data();
  for (int window = 0; window < 2; ++window) {
    at::Tensor expected = at::zeros({3, 8}, at::kFloat);
    for (int m = 0; m < 2; ++m) {
      zo.begin_backward(m == 1);
      at::Tensor loss = at::zeros({}, at::kFloat);
      for (int i = 0; i < 3; ++i) loss = loss + params[i].to(at::kFloat).sum() * (i + 1 + m);
      loss.backward();
      zo.end_backward();
      for (int i = 0; i < 3; ++i) expected[i] += static_cast<double>(i + 1 + m);
      // Every .grad is a view of the one buffer, which is the partition.
      for (const auto& p : params)
        EXPECT_EQ(p.grad().storage().data(), zo.grad_partition().storage().data());
    }
    // After the boundary the partition holds the window's sums, in each parameter's place.
    for (int i = 0; i < 3; ++i) {
      const auto& lp = zo.layout().params[i];
      EXPECT_TRUE(zo.grad_partition()
                      .slice(0, lp.offset, lp.offset + lp.numel)
                      .to(at::kFloat)
                      .equal(expected[i]))
          << "window " << window << " parameter " << i;
    }
    zo.step(1.0);
    // The step empties it for the next window.
    EXPECT_EQ(zo.grad_partition().abs().sum().item<double>(), 0.0) << "window " << window;
  }
  // Nothing re-allocated it: the same partition.
  EXPECT_EQ(zo.grad_partition().storage().data(), storage);
}

TEST(GradAlias, NoAliasWhereTheReductionIsNotTheIdentity) {
  const auto aliased = [](ZeroOptions o, int world, at::ScalarType dtype) {
    std::vector<at::Tensor> params;
    for (int i = 0; i < 3; ++i) params.push_back(at::randn({16}).to(dtype).requires_grad_());
    dscpp::OptimizerConfig oc;
    oc.type = "Adam";
    auto opt = dscpp::optim::make_optimizer(oc);
    opt->set_cpu_kernels(o.offload.enabled);
    ZeroOptimizer zo(params, std::move(opt), dscpp::comm::make_no_op_group(0, world), o);
    return zo.grads_aliased();
  };
  ZeroOptions bf16;
  bf16.stage = 1;
  bf16.grad_dtype = at::kBFloat16;
  EXPECT_TRUE(aliased(bf16, 1, at::kBFloat16));  // (the baseline of the rest)
  EXPECT_FALSE(aliased(bf16, 2, at::kBFloat16)) << "two ranks";
  ZeroOptions s0 = bf16;
  s0.stage = 0;
  EXPECT_TRUE(aliased(s0, 1, at::kBFloat16)) << "stage 0";
  EXPECT_FALSE(aliased(s0, 2, at::kBFloat16)) << "stage 0, two ranks";
  ZeroOptions s2 = bf16;
  s2.stage = 2;
  EXPECT_FALSE(aliased(s2, 1, at::kBFloat16)) << "stage 2 (no flat buffer)";
  ZeroOptions no_acc = bf16;
  no_acc.accumulates = false;
  EXPECT_FALSE(aliased(no_acc, 1, at::kBFloat16)) << "no accumulation (no flat buffer)";
  ZeroOptions fp32_part = bf16;  // bf16 gradients into an fp32 partition (grad_accum_dtype fp32)
  fp32_part.grad_dtype = at::kFloat;
  EXPECT_FALSE(aliased(fp32_part, 1, at::kBFloat16)) << "fp32 partition of bf16 gradients";
  EXPECT_TRUE(aliased(fp32_part, 1, at::kFloat)) << "fp32 training";
  ZeroOptions comm = bf16;
  comm.communication_data_type = at::kFloat;
  EXPECT_FALSE(aliased(comm, 1, at::kBFloat16)) << "communication_data_type fp32";
  ZeroOptions pre = bf16;
  pre.gradient_predivide_factor = 2.0;
  EXPECT_FALSE(aliased(pre, 1, at::kBFloat16)) << "gradient_predivide_factor";
  ZeroOptions prescale = bf16;
  prescale.prescale_gradients = true;
  EXPECT_FALSE(aliased(prescale, 1, at::kBFloat16)) << "prescale_gradients";
  ZeroOptions off = bf16;
  off.offload.enabled = true;
  EXPECT_FALSE(aliased(off, 1, at::kBFloat16)) << "offload";
  // Experts (a group of one averaged over more): a 16-bit partition defers the averaging to the
  // step and may alias; an fp32 one would scale as it adds, and does not.
  ZeroOptions experts = bf16;
  experts.average_over = 4;
  EXPECT_TRUE(aliased(experts, 1, at::kBFloat16)) << "16-bit, averaged over 4";
  ZeroOptions experts32 = fp32_part;
  experts32.average_over = 4;
  EXPECT_FALSE(aliased(experts32, 1, at::kFloat)) << "fp32, averaged over 4";
}

TEST(GradAlias, APartitionForcedOntoTheBufferWhereItIsNotExactIsRefused) {
  const dscpp::zero::FlatLayout layout = dscpp::zero::FlatLayout::build({8, 8}, 1, 100, 8);
  std::vector<at::Tensor> params{at::zeros({8}, at::kBFloat16).requires_grad_(),
                                 at::zeros({8}, at::kBFloat16).requires_grad_()};
  at::Tensor flat = at::zeros({layout.total}, at::kBFloat16);
  dscpp::zero::ReduceOptions ro;
  ro.scatter = true;
  ro.communication_data_type = at::kFloat;
  GradBuckets buckets(layout, flat, params, flat.options(), dscpp::comm::make_no_op_group(0, 1),
                      ro);
  try {
    buckets.set_partition(flat);
    ADD_FAILURE() << "a partition on the buffer with a communication type was accepted";
  } catch (const dscpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the gradient partition is the flat gradient buffer"),
              std::string::npos)
        << e.what();
  }
  ro.communication_data_type.reset();
  GradBuckets fine(layout, flat, params, flat.options(), dscpp::comm::make_no_op_group(0, 1), ro);
  fine.set_partition(flat);
  EXPECT_TRUE(fine.sink().aliases_flat());
}

}  // namespace
