// make_no_op_group: every collective leaves what this rank's own contribution would give
// alone, and none waits for a peer (rank 1 of 4 here, in one process with no other rank).
#include "dscpp/comm/no_op_group.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

using dscpp::comm::make_no_op_group;
using dscpp::comm::ReduceOp;

TEST(NoOpGroup, ReduceScatterKeepsThisRanksChunkUnreduced) {
  auto g = make_no_op_group(1, 4);
  at::Tensor in = at::arange(8, at::kFloat);
  at::Tensor out = at::full({2}, -1.0f);
  g->reduce_scatter(out, in, ReduceOp::kSum).wait();
  EXPECT_TRUE(out.equal(at::tensor({2.0f, 3.0f})));
  g->reduce_scatter(out, in, ReduceOp::kAvg).wait();  // no division by 4 either
  EXPECT_TRUE(out.equal(at::tensor({2.0f, 3.0f})));
}

TEST(NoOpGroup, AllGatherWritesOnlyThisRanksPlace) {
  auto g = make_no_op_group(1, 4);
  at::Tensor out = at::zeros({8});
  g->all_gather(out, at::tensor({5.0f, 6.0f})).wait();
  EXPECT_TRUE(out.equal(at::tensor({0.0f, 0.0f, 5.0f, 6.0f, 0.0f, 0.0f, 0.0f, 0.0f})));
  // In place (the input is this rank's place in the output): nothing moves.
  at::Tensor flat = at::arange(8, at::kFloat);
  g->all_gather(flat, flat.slice(0, 2, 4)).wait();
  EXPECT_TRUE(flat.equal(at::arange(8, at::kFloat)));
  std::vector<at::Tensor> outs{at::zeros({2}), at::zeros({2}), at::zeros({2}), at::zeros({2})};
  g->all_gather(outs, at::tensor({7.0f, 8.0f})).wait();
  EXPECT_TRUE(outs[1].equal(at::tensor({7.0f, 8.0f})));
  EXPECT_TRUE(outs[0].equal(at::zeros({2})));
}

TEST(NoOpGroup, AllReduceBroadcastAndBarrierLeaveTensorsAsTheyAre) {
  auto g = make_no_op_group(1, 4, "nccl");
  EXPECT_EQ(g->rank(), 1);
  EXPECT_EQ(g->size(), 4);
  EXPECT_EQ(g->backend_name(), "nccl");  // what a caller picks its device by
  at::Tensor t = at::tensor({1.0f, 2.0f});
  g->all_reduce(t, ReduceOp::kSum).wait();
  g->all_reduce(t, ReduceOp::kAvg).wait();
  g->broadcast(t, 0).wait();
  g->barrier().wait();
  EXPECT_TRUE(t.equal(at::tensor({1.0f, 2.0f})));
  at::Tensor out = at::zeros({8});
  g->all_to_all(out, at::arange(8, at::kFloat)).wait();
  EXPECT_TRUE(out.equal(at::tensor({0.0f, 0.0f, 2.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f})));
}

TEST(NoOpGroup, ShapedLikeAnotherGroup) {
  auto like = make_no_op_group(2, 3, "gloo");
  auto g = make_no_op_group(*like);
  EXPECT_EQ(g->rank(), 2);
  EXPECT_EQ(g->size(), 3);
  EXPECT_EQ(g->backend_name(), "gloo");
}

TEST(NoOpGroup, RankOutsideTheGroupIsAnError) {
  EXPECT_THROW(make_no_op_group(4, 4), dscpp::comm::CommError);
  EXPECT_THROW(make_no_op_group(0, 0), dscpp::comm::CommError);
}

}  // namespace
