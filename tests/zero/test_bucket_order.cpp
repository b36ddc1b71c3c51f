// Bucket order from the first backward: a model whose modules are registered in the opposite
// order of their use. The first layout (reverse registration order) puts the module used
// first in the first bucket, so under it no bucket is complete before the very end of
// backward. At stages 0-2 nothing but the 16-bit parameters exists before the first backward;
// its ready order lays everything out, after which the first bucket is issued while backward
// still runs. Stage 3, and an optimizer asked for its parts before the first backward, keep
// the guess. Training matches plain SGD on the same model in every case, the first backward's
// gradients reduced at its end.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/zero/zero_optimizer.h"

namespace {

using dscpp::zero::ZeroOptimizer;

// Registered: late (used second), then early (used first).
struct Net {
  at::Tensor w_late, b_late, w_early, b_early;
  std::vector<at::Tensor> params() const { return {w_late, b_late, w_early, b_early}; }
  at::Tensor loss(const at::Tensor& x) const {
    at::Tensor h = at::tanh(at::addmm(b_early, x, w_early.t()));
    return at::addmm(b_late, h, w_late.t()).pow(2).sum();
  }
};

Net make_net() {
  at::manual_seed(7);
  Net n{at::randn({4, 4}), at::randn({4}), at::randn({4, 4}), at::randn({4})};
  for (auto& p : n.params()) p.set_requires_grad(true);
  return n;
}

constexpr double kLr = 0.1;

std::unique_ptr<dscpp::optim::Optimizer> sgd() {
  dscpp::OptimizerConfig c;
  c.type = "sgd";
  c.params = {{"lr", kLr}};
  return dscpp::optim::make_optimizer(c);
}

struct TrainResult {
  std::vector<int> issued;  // per reducing backward: buckets issued during it
  std::vector<at::Tensor> final_params;
};

TrainResult train(int stage, int accumulation, int steps, const std::vector<at::Tensor>& inputs,
                  bool ask_first = false) {
  Net net = make_net();
  dscpp::zero::ZeroOptions o;
  o.stage = stage;
  o.reduce_bucket_size = 20;  // one module (16 + 4 elements) per bucket
  o.overlap_comm = true;
  o.alignment = 1;
  ZeroOptimizer zo(net.params(), sgd(), dscpp::comm::make_no_op_group(0, 1), o);
  EXPECT_EQ(zo.layout().buckets.size(), 2u);
  // The guess: the early module (parameters 2 and 3) opens the buffer.
  EXPECT_EQ(zo.layout().params[2].bucket, 0);
  // Before the first backward, nothing but the parameters (stage 3: all of it).
  EXPECT_EQ(zo.is_built(), stage >= 3);
  bool has_master = false;
  for (const auto& buffer : zo.memory_breakdown()) has_master |= buffer.name == "fp32_master";
  EXPECT_EQ(has_master, stage >= 3);
  if (ask_first) {  // as a checkpoint load before training does
    (void)zo.master_partition();
    EXPECT_TRUE(zo.is_built());
  }
  TrainResult run;
  size_t next = 0;
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < accumulation; ++m) {
      const bool reduce = stage >= 2 || m == accumulation - 1;
      zo.begin_backward(reduce);
      zo.gather();
      net.loss(inputs.at(next++)).backward();
      zo.end_backward();
      zo.release();
      if (reduce) run.issued.push_back(zo.buckets_issued_during_backward());
    }
    EXPECT_TRUE(zo.step(1.0).applied);
  }
  // Laid out by the first backward: the late module, whose gradients come first, opens it.
  const bool laid_by_backward = stage < 3 && !ask_first;
  EXPECT_EQ(zo.layout().params[0].bucket, laid_by_backward ? 0 : 1);
  EXPECT_EQ(zo.layout().params[2].bucket, laid_by_backward ? 1 : 0);
  zo.gather();
  for (const auto& p : net.params()) run.final_params.push_back(p.detach().clone());
  zo.release();
  return run;
}

// Plain SGD on the same model: the summed gradients of each step's micro-batches.
std::vector<at::Tensor> reference(int accumulation, int steps,
                                  const std::vector<at::Tensor>& inputs) {
  Net net = make_net();
  size_t next = 0;
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < accumulation; ++m) net.loss(inputs.at(next++)).backward();
    at::NoGradGuard no_grad;
    for (auto& p : net.params()) {
      p.sub_(p.grad() * kLr);
      p.mutable_grad().reset();
    }
  }
  std::vector<at::Tensor> out;
  for (const auto& p : net.params()) out.push_back(p.detach().clone());
  return out;
}

class BucketOrder : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(BucketOrder, FirstBackwardLaysBucketsOutAndTrainingMatchesSgd) {
  const auto [stage, accumulation, ask_first] = GetParam();
  // One thread: the matrix products round alike in both runs whatever the machine's load.
  at::set_num_threads(1);
  const int steps = 3;
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < steps * accumulation; ++i) inputs.push_back(at::randn({3, 4}));
  TrainResult run = train(stage, accumulation, steps, inputs, ask_first);
  // Under the guess nothing can be issued before backward's end, nor during the first backward
  // of stages 0-2 (its gradients are reduced at its end; at stages 0-1 with accumulation that
  // backward does not reduce). Laid out by the first backward, the late module's bucket goes
  // while the early module's gradients are still to come.
  const bool laid_by_backward = stage < 3 && !ask_first;
  const bool first_reduces = stage >= 2 || accumulation == 1;
  EXPECT_EQ(run.issued.front(), laid_by_backward && !first_reduces ? 1 : 0);
  EXPECT_EQ(run.issued.back(), laid_by_backward ? 1 : 0);
  auto want = reference(accumulation, steps, inputs);
  // A few float32 roundings apart (the bucket sums a step's micro-batches in its own order;
  // CPUs of another vector width round the products differently): 1e-5 sits far below what a
  // gradient lost or counted twice at the first backward's end would move (0.1 at this
  // learning rate).
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(at::allclose(run.final_params[i], want[i], 1e-5, 1e-5))
        << "stage " << stage << " parameter " << i << ": max difference "
        << (run.final_params[i] - want[i]).abs().max().item<float>() << "\n"
        << run.final_params[i] << "\n"
        << want[i];
}

INSTANTIATE_TEST_SUITE_P(
    Stages, BucketOrder,
    ::testing::Values(std::make_tuple(0, 1, false), std::make_tuple(1, 2, false),
                      std::make_tuple(2, 1, false), std::make_tuple(2, 2, false),
                      std::make_tuple(3, 1, false), std::make_tuple(1, 2, true),
                      std::make_tuple(2, 1, true)));

}  // namespace
