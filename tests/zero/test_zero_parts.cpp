// ZeRO's parts on their own, in one process: the step's one norm / clip / unscale computation
// (step_scale.h) against hand-computed values, the same on the host and as device-style
// tensor arithmetic; and the parameter store's stage-3 life (partition, gather, publish,
// release) over a one-rank group.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/param_store.h"
#include "dscpp/zero/step_scale.h"

namespace {

using dscpp::zero::FlatLayout;
using dscpp::zero::ParamStore;
using dscpp::zero::StepScaleInputs;
using dscpp::zero::unscale_and_clip;

double as_double(const at::Tensor& t) {
  return t.item<double>();
}

TEST(StepScale, UnscalesWithoutClipping) {
  StepScaleInputs in;
  in.loss_scale = 4.0;
  // sqrt(16) / 4 = 1; the scale is 1 / loss_scale.
  auto s = unscale_and_clip(16.0, in);
  EXPECT_EQ(s.norm, 1.0);
  EXPECT_EQ(s.scale, 0.25);
}

TEST(StepScale, ClipsAboveTheThresholdAndAveragesDeferredSums) {
  StepScaleInputs in;
  in.loss_scale = 4.0;
  in.deferred = 0.5;  // a 16-bit partition of sums over 2 ranks
  in.clip = 0.25;
  // norm = sqrt(16) * 0.5 / 4 = 0.5; DeepSpeed's clip coefficient (0.5 + 1e-6) / 0.25.
  auto s = unscale_and_clip(16.0, in);
  EXPECT_EQ(s.norm, 0.5);
  EXPECT_DOUBLE_EQ(s.scale, 0.5 / (4.0 * ((0.5 + 1e-6) / 0.25)));
  // Below the threshold the clip leaves the scale alone.
  in.clip = 10.0;
  EXPECT_DOUBLE_EQ(unscale_and_clip(16.0, in).scale, 0.5 / 4.0);
}

TEST(StepScale, HostAndTensorEvaluationsAgreeToTheBit) {
  for (double sumsq : {0.0, 1e-12, 3.7, 12345.678, 9.9e20}) {
    for (double clip : {0.0, 1.0, 0.013}) {
      StepScaleInputs in;
      in.loss_scale = 65536.0;
      in.deferred = 1.0 / 3.0;
      in.clip = clip;
      auto host = unscale_and_clip(sumsq, in);
      auto dev = unscale_and_clip(at::full({}, sumsq, at::kDouble), in);
      EXPECT_EQ(host.norm, as_double(dev.norm)) << sumsq << " clip " << clip;
      EXPECT_EQ(host.scale, as_double(dev.scale)) << sumsq << " clip " << clip;
    }
  }
  // A non-finite sum gives a non-finite scale either way (the overflow verdict).
  StepScaleInputs in;
  EXPECT_FALSE(std::isfinite(unscale_and_clip(INFINITY, in).norm));
  EXPECT_FALSE(std::isfinite(as_double(unscale_and_clip(at::full({}, NAN, at::kDouble), in).norm)));
}

TEST(ParamStore, Stage3PartitionGatherPublishRelease) {
  // Three parameters of 5, 3 and 10 elements, buckets of about 8: two buckets.
  std::vector<at::Tensor> params{at::arange(5, at::kFloat), at::arange(3, at::kFloat) + 10,
                                 at::arange(10, at::kFloat).view({2, 5}) + 20};
  auto l = FlatLayout::build({5, 3, 10}, 1, 8, 2);
  ParamStore store(params, l, dscpp::comm::make_no_op_group(0, 1));
  at::Tensor master = at::empty({l.partition});
  store.copy_partition_into(master);
  EXPECT_EQ(master.sum().item<float>(), 10.0f + 33.0f + 245.0f);
  store.keep_only_partition(master);
  EXPECT_EQ(store.params_numel_held(), 0);  // every parameter an empty tensor at rest
  EXPECT_EQ(store.partition16_numel(), l.partition);

  store.gather();
  EXPECT_TRUE(store.gathered());
  EXPECT_TRUE(params[2].equal(at::arange(10, at::kFloat).view({2, 5}) + 20));
  EXPECT_EQ(store.live_numel(), l.total);

  // The one publish routine: a changed master reaches the partition and the gathered buckets.
  master.add_(1);
  store.publish(master);
  EXPECT_TRUE(params[0].equal(at::arange(5, at::kFloat) + 1));
  store.release();
  EXPECT_EQ(store.params_numel_held(), 0);
  EXPECT_EQ(store.live_numel(), 0);
  EXPECT_EQ(store.peak_live_numel(), l.total);

  // A persistent bucket stays gathered through release() and is refreshed by publish.
  const int b = l.params[1].bucket;
  store.make_persistent(b);
  store.release();
  EXPECT_TRUE(params[1].equal(at::arange(3, at::kFloat) + 11));
  master.add_(1);
  store.publish(master);
  EXPECT_TRUE(params[1].equal(at::arange(3, at::kFloat) + 12));
  EXPECT_EQ(store.live_numel(), 0);  // persistent buckets are not counted as live
}

TEST(ParamStore, Stages0To2ParametersAreViewsOfTheFlatBuffer) {
  std::vector<at::Tensor> params{at::ones({2, 2}), at::full({3}, 2.0f)};
  auto l = FlatLayout::build({4, 3}, 1, 100, 2);
  ParamStore store(params, l, dscpp::comm::make_no_op_group(0, 1));
  store.flat_params().fill_(7);
  EXPECT_TRUE(params[0].equal(at::full({2, 2}, 7.0f)));
  at::Tensor master = at::arange(l.partition, at::kFloat);
  store.publish(master);
  EXPECT_EQ(params[1][0].item<float>(), master[l.params[1].offset].item<float>());
}

}  // namespace
