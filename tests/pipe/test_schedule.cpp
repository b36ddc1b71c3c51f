// pipe/schedule.h against its contract and the bubble formulas, every stage's list checked
// together (tests/pipe/schedule_check.h), and against DeepSpeed's TrainSchedule by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/pipe/schedule.h"
#include "tests/pipe/schedule_check.h"

namespace dscpp::pipe {
namespace {

using testing::build;
using testing::check_contract;
using testing::simulate;

std::vector<std::string> names(const Step& step) {
  std::vector<std::string> out;
  for (const Instruction& i : step) out.push_back(to_string(i));
  return out;
}

// 1F1B: the contract, and the makespan of the event simulation (F = 1, B = 2) equals
// (m + p - 1)(F + B), i.e. each stage idles (p - 1)/(m + p - 1) of the step, exactly.
void check_one_f_one_b(int p, int m) {
  SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m);
  const auto pipe = build(p, m, 1, true);
  EXPECT_EQ(check_contract(pipe), "");
  const auto timing = simulate(pipe, 1.0, 2.0);
  EXPECT_DOUBLE_EQ(timing.makespan, (m + p - 1) * 3.0);
  for (int s = 0; s < p; ++s) {
    EXPECT_DOUBLE_EQ(timing.busy[s], m * 3.0);
    EXPECT_NEAR(1.0 - timing.busy[s] / timing.makespan, (p - 1.0) / (m + p - 1.0), 1e-12)
        << "stage " << s;
  }
  EXPECT_DOUBLE_EQ(bubble_fraction({p, 0, m, 1}), (p - 1.0) / m);
  const auto inference = build(p, m, 1, false);
  EXPECT_EQ(check_contract(inference), "");
  EXPECT_DOUBLE_EQ(simulate(inference, 1.0, 2.0).makespan, (m + p - 1) * 1.0);
}

TEST(Schedule, OneFOneBKeepsTheContractAndTheBubbleFormula) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 7, 8}) check_one_f_one_b(p, m);
}

TEST(ScheduleGrid, OneFOneBEveryShape) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m = 1; m <= 32; ++m) check_one_f_one_b(p, m);
}

// DeepSpeed's TrainSchedule(micro_batches=2, stages=2) printed by deepspeed 0.19 (stage 0
// and stage 1), translated to our names: the step arithmetic and DeepSpeed's order.
TEST(Schedule, TwoStagesTwoMicroBatchesAsDeepSpeed) {
  const auto s0 = train_schedule({2, 0, 2, 1});
  const auto s1 = train_schedule({2, 1, 2, 1});
  ASSERT_EQ(s0.size(), 6u);
  ASSERT_EQ(s1.size(), 6u);
  using V = std::vector<std::string>;
  EXPECT_EQ(names(s0[0]), (V{"LoadMicroBatch(micro_batch=0, chunk=0, buffer=0)",
                             "ForwardPass(micro_batch=0, chunk=0, buffer=0)"}));
  EXPECT_EQ(names(s0[1]), (V{"SendActivation(micro_batch=0, chunk=0, buffer=0)"}));
  EXPECT_EQ(names(s0[2]), (V{"LoadMicroBatch(micro_batch=1, chunk=0, buffer=1)",
                             "ForwardPass(micro_batch=1, chunk=0, buffer=1)"}));
  EXPECT_EQ(names(s0[3]), (V{"RecvGrad(micro_batch=0, chunk=0, buffer=0)",
                             "SendActivation(micro_batch=1, chunk=0, buffer=1)",
                             "BackwardPass(micro_batch=0, chunk=0, buffer=0)"}));
  EXPECT_EQ(names(s0[4]), (V{}));
  EXPECT_EQ(names(s0[5]), (V{"RecvGrad(micro_batch=1, chunk=0, buffer=1)",
                             "BackwardPass(micro_batch=1, chunk=0, buffer=1)", "ReduceTiedGrads()",
                             "ReduceGrads()", "OptimizerStep()"}));
  EXPECT_EQ(names(s1[0]), (V{}));
  EXPECT_EQ(names(s1[1]), (V{"RecvActivation(micro_batch=0, chunk=0, buffer=0)",
                             "LoadMicroBatch(micro_batch=0, chunk=0, buffer=0)",
                             "ForwardPass(micro_batch=0, chunk=0, buffer=0)"}));
  EXPECT_EQ(names(s1[2]), (V{"BackwardPass(micro_batch=0, chunk=0, buffer=0)"}));
  EXPECT_EQ(names(s1[3]), (V{"SendGrad(micro_batch=0, chunk=0, buffer=0)",
                             "RecvActivation(micro_batch=1, chunk=0, buffer=1)",
                             "LoadMicroBatch(micro_batch=1, chunk=0, buffer=1)",
                             "ForwardPass(micro_batch=1, chunk=0, buffer=1)"}));
  EXPECT_EQ(names(s1[4]), (V{"BackwardPass(micro_batch=1, chunk=0, buffer=1)"}));
  EXPECT_EQ(names(s1[5]), (V{"SendGrad(micro_batch=1, chunk=0, buffer=1)", "ReduceTiedGrads()",
                             "ReduceGrads()", "OptimizerStep()"}));
}

// Slots: DeepSpeed's num_pipe_buffers on the first and last stage; one more on a middle one.
TEST(Schedule, BufferCounts) {
  EXPECT_EQ(num_buffers(train_schedule({4, 0, 8, 1})), 4);
  EXPECT_EQ(num_buffers(train_schedule({4, 1, 8, 1})), 4);
  EXPECT_EQ(num_buffers(train_schedule({4, 2, 8, 1})), 3);
  EXPECT_EQ(num_buffers(train_schedule({4, 3, 8, 1})), 2);
  EXPECT_EQ(num_buffers(train_schedule({4, 0, 2, 1})), 2);
  EXPECT_EQ(num_buffers(train_schedule({4, 0, 1, 1})), 1);  // only slot 0 is ever used
  EXPECT_EQ(num_buffers(inference_schedule({4, 1, 8, 1})), 2);
}

TEST(Schedule, PeersAndNames) {
  const PipeShape mid{4, 1, 8, 1};
  EXPECT_EQ(peer_of(mid, {Op::kSendActivation, 0, 0, 0}).stage, 2);
  EXPECT_EQ(peer_of(mid, {Op::kRecvActivation, 0, 0, 0}).stage, 0);
  EXPECT_EQ(peer_of(mid, {Op::kSendGrad, 0, 0, 0}).stage, 0);
  EXPECT_EQ(peer_of(mid, {Op::kRecvGrad, 0, 0, 0}).stage, 2);
  // Interleaved: the last stage's activation goes to stage 0's next chunk.
  const Peer wrap = peer_of({4, 3, 8, 2}, {Op::kSendActivation, 0, 0, 0});
  EXPECT_EQ(wrap.stage, 0);
  EXPECT_EQ(wrap.chunk, 1);
  const Peer back = peer_of({4, 0, 8, 2}, {Op::kSendGrad, 0, 1, 0});
  EXPECT_EQ(back.stage, 3);
  EXPECT_EQ(back.chunk, 0);
  EXPECT_THROW(peer_of({4, 0, 8, 1}, {Op::kRecvActivation, 0, 0, 0}), Error);
  EXPECT_THROW(peer_of({4, 3, 8, 1}, {Op::kSendActivation, 0, 0, 0}), Error);
  EXPECT_THROW(peer_of(mid, {Op::kForward, 0, 0, 0}), Error);
  EXPECT_EQ(to_string({Op::kOptimizerStep}), "OptimizerStep()");
  EXPECT_DOUBLE_EQ(bubble_fraction({4, 0, 8, 2}), 3.0 / 16.0);
}

TEST(Schedule, RefusesBadShapes) {
  EXPECT_THROW(train_schedule({0, 0, 1, 1}), Error);
  EXPECT_THROW(train_schedule({2, 2, 1, 1}), Error);
  EXPECT_THROW(train_schedule({2, 0, 0, 1}), Error);
  EXPECT_THROW(train_schedule({2, 0, 1, 0}), Error);
  EXPECT_THROW(inference_schedule({2, 0, 4, 2}), Error);
}

}  // namespace
}  // namespace dscpp::pipe

namespace dscpp::pipe {
namespace {

// The checker is not vacuous: broken lists are caught, each with its reason.
TEST(Schedule, CheckerCatchesBrokenLists) {
  auto base = testing::build(4, 8, 1, true);
  {  // DeepSpeed's own count on stage 1 (p - s = 3 slots): b and b + 3 share step and slot.
    auto pipe = base;
    for (Step& step : pipe.lists[1])
      for (Instruction& i : step)
        if (i.micro_batch >= 0) i.buffer = i.micro_batch % 3;
    EXPECT_NE(testing::check_contract(pipe).find("while live"), std::string::npos)
        << testing::check_contract(pipe);
  }
  {  // A receive dropped: its send has no partner.
    auto pipe = base;
    auto& step = pipe.lists[1][1];
    ASSERT_EQ(step.front().op, Op::kRecvActivation);
    step.erase(step.begin());
    EXPECT_NE(testing::check_contract(pipe).find("do not match"), std::string::npos)
        << testing::check_contract(pipe);
  }
  {  // A forward moved a step ahead of its input on both sides of the link.
    auto pipe = base;
    std::swap(pipe.lists[1][1], pipe.lists[1][0]);
    std::swap(pipe.lists[0][1], pipe.lists[0][0]);
    EXPECT_NE(testing::check_contract(pipe), "");
  }
}

}  // namespace
}  // namespace dscpp::pipe
