// ZeRO-Offload's step (zero/offload.h) in one process: an offloaded ZeroOptimizer keeps its
// master and optimizer state on the host, steps in sub_group_size pieces, and publishes the
// same parameters as the same optimizer without offload, in fp32 and in bf16.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/error.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/zero_optimizer.h"

namespace {

using dscpp::zero::ZeroOptimizer;
using dscpp::zero::ZeroOptions;

std::unique_ptr<dscpp::optim::Optimizer> adamw(bool cpu_kernels) {
  dscpp::OptimizerConfig c;
  c.type = "AdamW";
  c.params = {{"lr", 0.01}, {"weight_decay", 0.1}};
  auto o = dscpp::optim::make_optimizer(c);
  o->set_cpu_kernels(cpu_kernels);
  return o;
}

struct Trainer {
  std::vector<at::Tensor> params;
  std::unique_ptr<ZeroOptimizer> zero;
};

Trainer make_run(int stage, at::ScalarType dtype, bool offload, int64_t sub_group_size) {
  at::manual_seed(11);
  Trainer r;
  for (int64_t n : {37, 200, 5}) r.params.push_back(at::randn({n}).to(dtype).requires_grad_());
  ZeroOptions o;
  o.stage = stage;
  o.reduce_bucket_size = 64;  // several buckets
  o.grad_dtype = dtype;
  o.offload.enabled = offload;
  o.offload.sub_group_size = sub_group_size;
  r.zero = std::make_unique<ZeroOptimizer>(r.params, adamw(offload),
                                           dscpp::comm::make_no_op_group(0, 1), o);
  return r;
}

void train(Trainer& r, int steps) {
  for (int s = 0; s < steps; ++s) {
    r.zero->gather();  // stage 3: whole around forward and backward (no-op below)
    r.zero->begin_backward(true);
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (size_t i = 0; i < r.params.size(); ++i)
      loss = loss + (r.params[i].to(at::kFloat) * (s + 1.0 + i)).sin().sum();
    loss.backward();
    r.zero->end_backward();
    r.zero->release();
    r.zero->step(1.0);
  }
}

TEST(Offload, StepsLikeNoOffloadWithTheMasterOnTheHost) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int stage : {1, 2, 3}) {
      Trainer plain = make_run(stage, dtype, false, 1000000000);
      Trainer off = make_run(stage, dtype, true, 7);  // pieces of 7 elements
      train(plain, 3);
      train(off, 3);
      ASSERT_TRUE(off.zero->offloaded());
      EXPECT_TRUE(off.zero->master_partition().device().is_cpu());
      const double err =
          off.zero->master_partition().sub(plain.zero->master_partition()).norm().item<double>() /
          plain.zero->master_partition().norm().item<double>();
      EXPECT_LT(err, 1e-6) << "stage " << stage << " " << c10::toString(dtype);
      off.zero->gather();
      plain.zero->gather();
      for (size_t i = 0; i < off.params.size(); ++i) {
        // bf16: the published copy rounds the same master to the same bf16 (a rare
        // rounding boundary would differ by one ulp).
        const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
        EXPECT_TRUE(
            at::allclose(off.params[i].to(at::kFloat), plain.params[i].to(at::kFloat), tol, tol))
            << "parameter " << i << " stage " << stage;
      }
    }
  }
}

TEST(Offload, NeedsAPartitionedStage) {
  std::vector<at::Tensor> params{at::randn({8}).requires_grad_()};
  ZeroOptions o;
  o.stage = 0;
  o.offload.enabled = true;
  EXPECT_THROW(ZeroOptimizer(params, adamw(true), dscpp::comm::make_no_op_group(0, 1), o),
               dscpp::Error);
}

}  // namespace
