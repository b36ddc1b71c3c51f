// Stage 3 in fp32 without offload keeps the master's buffer as its parameters' partition (one
// storage): the re-lay after the first backward moves it once, by the master, and the store
// shares it again after. Trained through a re-lay that moves parameters (backward reaches them
// in another order than the registration order's guess), one rank of stage 3 ends where stage 0
// does, bit for bit, over several steps. (On the host the store used to take a copy, which was
// right too; the double move this guards against showed only where a buffer is re-laid in its
// own storage, a GPU's: where one is present the test trains there.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/zero_optimizer.h"

using dscpp::zero::ZeroOptimizer;
using dscpp::zero::ZeroOptions;

namespace {

constexpr int kParams = 9;

// Where the offloaded 16-bit partition was before the re-lay, and after it.
struct Partition16 {
  const void* before = nullptr;
  const void* after = nullptr;
  bool pinned_after = false;
};

std::vector<at::Tensor> train(int stage, int steps, bool offload_param = false,
                              Partition16* where = nullptr) {
  at::manual_seed(11);
  std::vector<at::Tensor> params;
  const at::Device device = at::hasCUDA() ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  for (int i = 0; i < kParams; ++i)
    params.push_back(at::randn({16 + 8 * i}).to(device).requires_grad_());
  ZeroOptions o;
  o.stage = stage;
  o.reduce_bucket_size = 40;  // a few parameters a bucket
  o.grad_dtype = at::kFloat;
  o.offload_param.enabled = offload_param;
  o.offload_param.pin_memory = true;
  dscpp::OptimizerConfig oc;
  oc.type = "Adam";
  oc.params = {{"lr", 0.05}};
  ZeroOptimizer zero(params, dscpp::optim::make_optimizer(oc),
                     dscpp::comm::make_no_op_group(0, 1, device.is_cuda() ? "nccl" : "gloo"), o);
  // Terms added in this order: backward makes the gradients ready in its reverse, which is not
  // the reverse registration order the first layout guesses.
  const int order[kParams] = {4, 0, 7, 2, 8, 1, 6, 3, 5};
  if (where) where->before = zero.param_store().partition16().data_ptr();
  for (int s = 0; s < steps; ++s) {
    zero.gather();
    zero.begin_backward(true);
    at::Tensor loss = at::zeros({}, params[0].options());
    for (int k = 0; k < kParams; ++k) {
      const int i = order[k];
      loss = loss + (params[i] * (1.0 + i)).sin().sum();
    }
    loss.backward();
    zero.end_backward();
    zero.release();
    zero.step(1.0);
    if (where && s == 0) {
      where->after = zero.param_store().partition16().data_ptr();
      where->pinned_after = zero.param_store().partition16().is_pinned();
    }
  }
  zero.gather();
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().cpu());
  zero.release();
  return out;
}

}  // namespace

TEST(Stage3Relay, Fp32OnOneRankTrainsAsStage0ThroughTheRelay) {
  const auto reference = train(0, 4);
  const auto stage3 = train(3, 4);
  ASSERT_EQ(stage3.size(), reference.size());
  for (int i = 0; i < kParams; ++i) {
    ASSERT_EQ(stage3[i].sizes(), reference[i].sizes()) << "parameter " << i;
    EXPECT_TRUE(at::equal(stage3[i], reference[i])) << "parameter " << i;
  }
}

// Parameter offload: the 16-bit partition is the store's own page-locked host buffer, permuted
// where it is on one rank (it was re-laid into a new, pageable tensor, through which every
// upload then staged), and training still ends where stage 0 does.
TEST(Stage3Relay, OffloadedPartitionIsReLaidInItsPageLockedBuffer) {
  const auto reference = train(0, 4);
  Partition16 where;
  const auto offloaded = train(3, 4, /*offload_param=*/true, &where);
  ASSERT_NE(where.before, nullptr);
  EXPECT_EQ(where.after, where.before);
  if (at::hasCUDA()) {
    EXPECT_TRUE(where.pinned_after);
  }
  for (int i = 0; i < kParams; ++i)
    EXPECT_TRUE(at::equal(offloaded[i], reference[i])) << "parameter " << i;
}
