// ZeRO-Offload's step (zero/offload.h) in one process: an offloaded ZeroOptimizer keeps its
// master and optimizer state on the host, steps in sub_group_size pieces, and publishes the
// same parameters as the same optimizer without offload, in fp32 and in bf16.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/error.h"
#include "dscpp/ops/sum_of_squares.h"
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

Trainer make_run(int stage, at::ScalarType dtype, bool offload, int64_t sub_group_size,
                 double ratio = 1.0) {
  at::manual_seed(11);
  Trainer r;
  for (int64_t n : {37, 200, 5}) r.params.push_back(at::randn({n}).to(dtype).requires_grad_());
  ZeroOptions o;
  o.stage = stage;
  o.reduce_bucket_size = 64;  // several buckets
  o.grad_dtype = dtype;
  o.offload.enabled = offload;
  o.offload.sub_group_size = sub_group_size;
  o.offload.ratio = ratio;
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

TEST(Offload, ReportsTheStepsPhasesByNameAndStartsThemAgain) {
  Trainer off = make_run(2, at::kBFloat16, true, 7);
  train(off, 2);
  std::map<std::string, double> got;
  for (const auto& [name, ms] : off.zero->take_phase_times()) got[name] = ms;
  // The host gradient partition's landings, the host sum of squares, the CPU update.
  for (const char* name :
       {"step.sumsq", "landing.copy_wait", "landing.add", "landing.queue_wait",
        "offload.scale_read", "offload.cpu_update", "offload.copy_wait", "offload.publish"}) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_GE(got[name], 0.0) << name;
  }
  EXPECT_GT(got["offload.cpu_update"], 0.0);
  EXPECT_GT(got["step.sumsq"], 0.0);
  for (const auto& [name, ms] : off.zero->take_phase_times()) EXPECT_EQ(ms, 0.0) << name;
}

// One backward of train()'s loss at step s, without the step.
void backward(Trainer& r, int s) {
  r.zero->gather();
  r.zero->begin_backward(true);
  at::Tensor loss = at::zeros({}, at::kFloat);
  for (size_t i = 0; i < r.params.size(); ++i)
    loss = loss + (r.params[i].to(at::kFloat) * (s + 1.0 + i)).sin().sum();
  loss.backward();
  r.zero->end_backward();
  r.zero->release();
}

TEST(Offload, TheWindowsLastLandingsSumTheNormsSquares) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    Trainer off = make_run(2, dtype, true, 7);
    train(off, 1);  // (the first backward, which lays the buffers out)
    ASSERT_TRUE(off.zero->master().grads_on_host());
    // Two micro-steps, the second the window's last: the sums are of the accumulated chunks.
    backward(off, 1);
    EXPECT_FALSE(off.zero->grad_buckets().sink().landed_sumsq().has_value());  // not asked for
    off.zero->arm_overlapped_step(1.0);
    backward(off, 2);
    const std::optional<double> landed = off.zero->grad_buckets().sink().landed_sumsq();
    ASSERT_TRUE(landed.has_value()) << c10::toString(dtype);
    const double whole = dscpp::ops::host_sum_of_squares(off.zero->grad_partition());
    ASSERT_GT(whole, 0.0);
    EXPECT_NEAR(*landed, whole, 1e-12 * whole) << c10::toString(dtype);
    EXPECT_NEAR(off.zero->global_sumsq().item<double>(), whole, 1e-6 * whole);
    off.zero->step(1.0);
    EXPECT_FALSE(
        off.zero->grad_buckets().sink().landed_sumsq().has_value());  // cleared with the step
  }
}

TEST(Offload, HostShareCutsAtDeepSpeedsSubGroup) {
  // DeepSpeed: sub-group i of count goes to the CPU when i >= int((1 - ratio) * count).
  using dscpp::zero::HostShare;
  EXPECT_EQ((HostShare{1.0, 30}.host_begin(100)), 0);    // all on the host
  EXPECT_EQ((HostShare{0.5, 30}.host_begin(100)), 60);   // 4 sub-groups, 2 stay
  EXPECT_EQ((HostShare{0.3, 30}.host_begin(100)), 60);   // int(2.8) = 2 stay
  EXPECT_EQ((HostShare{0.0, 30}.host_begin(100)), 100);  // none on the host
  EXPECT_EQ((HostShare{0.5, 1000}.host_begin(100)), 0);  // one sub-group: int(0.5) = 0 stay
}

TEST(Offload, PartialOffloadStepsLikeNoOffload) {
  for (double ratio : {0.5, 0.25, 0.0}) {
    Trainer plain = make_run(3, at::kFloat, false, 1000000000);
    Trainer off = make_run(3, at::kFloat, true, 16, ratio);
    train(plain, 3);
    train(off, 3);
    const int64_t p = off.zero->layout().partition;
    const int64_t cut = dscpp::zero::HostShare{ratio, 16}.host_begin(p);
    ASSERT_GT(cut, 0);
    EXPECT_EQ(off.zero->master().host_begin(), cut);
    EXPECT_TRUE(off.zero->master().split());
    // The host's optimizer holds only the tail's state (Adam: two moments).
    EXPECT_EQ(off.zero->optimizer().state_numel(), 2 * (p - cut)) << "ratio " << ratio;
    EXPECT_TRUE(
        at::allclose(off.zero->master_partition(), plain.zero->master_partition(), 1e-6, 1e-6))
        << "ratio " << ratio;
    for (const auto& name : plain.zero->state_names()) {
      const at::Tensor a = off.zero->state_partition(name), b = plain.zero->state_partition(name);
      EXPECT_LT(a.sub(b).norm().item<double>() / b.norm().item<double>(), 1e-6)
          << name << " ratio " << ratio;
    }
  }
}

TEST(Offload, PartialOffloadNeedsStage3) {
  std::vector<at::Tensor> params{at::randn({8}).requires_grad_()};
  ZeroOptions o;
  o.stage = 2;
  o.offload.enabled = true;
  o.offload.ratio = 0.5;
  EXPECT_THROW(ZeroOptimizer(params, adamw(true), dscpp::comm::make_no_op_group(0, 1), o),
               dscpp::Error);
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
