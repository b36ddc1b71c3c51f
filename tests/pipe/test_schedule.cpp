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
// (m + p - 1)(F + B), i.e. each stage idles (p - 1)/(m + p - 1) of the step, (p - 1)/m of
// its ideal time m(F + B), exactly.
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
    EXPECT_NEAR((timing.makespan - timing.busy[s]) / timing.busy[s], (p - 1.0) / m, 1e-12)
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
  EXPECT_THROW(inference_schedule({2, 0, 3, 2}), Error);  // interleaved: 3 % 2 != 0
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

namespace dscpp::pipe {
namespace {

// Interleaved 1F1B: the contract, and per stage the idle time of the event simulation
// (F = 1, B = 2 per stage, F/v and B/v per chunk) over the stage's ideal time m(F + B),
// within 10% of Megatron's (p - 1)/(v m).
void check_interleaved(int p, int m, int v) {
  SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m << " v=" << v);
  const auto pipe = testing::build(p, m, v, true);
  EXPECT_EQ(testing::check_contract(pipe), "");
  const auto timing = testing::simulate(pipe, 1.0, 2.0);
  const double formula = (p - 1.0) / (v * m);
  // Forward only (eval_batch): the contract, and the idle time over the ideal m F within 10%
  // of the same (p - 1)/(v m).
  const auto inference = testing::build(p, m, v, false);
  EXPECT_EQ(testing::check_contract(inference), "");
  const auto forward = testing::simulate(inference, 1.0, 2.0);
  for (int s = 0; s < p; ++s)
    EXPECT_NEAR((forward.makespan - forward.busy[s]) / forward.busy[s], formula, 0.1 * formula)
        << "stage " << s;
  EXPECT_DOUBLE_EQ(bubble_fraction({p, 0, m, v}), formula);
  for (int s = 0; s < p; ++s) {
    EXPECT_NEAR(timing.busy[s], m * 3.0, 1e-9);
    const double idle_over_ideal = (timing.makespan - timing.busy[s]) / timing.busy[s];
    EXPECT_NEAR(idle_over_ideal, formula, 0.1 * formula) << "stage " << s;
  }
}

TEST(Schedule, InterleavedKeepsTheContractAndMegatronsBubble) {
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 3 * p}) check_interleaved(p, m, v);
  check_interleaved(3, 6, 2);
}

TEST(ScheduleGrid, InterleavedEveryShape) {
  for (int p : {2, 3, 4, 8})
    for (int v : {2, 3})
      for (int m = p; m <= 32; m += p) check_interleaved(p, m, v);
}

// Megatron's warm-up: stage s runs (p - s - 1) * 2 + (v - 1) * p forwards before its first
// backward; the chunk of its k-th forward is (k / p) % v.
TEST(Schedule, InterleavedFollowsMegatronsOrder) {
  const int p = 4, m = 8, v = 2;
  for (int s = 0; s < p; ++s) {
    int forwards = 0, k = 0;
    bool backward_seen = false;
    for (const Step& step : train_schedule({p, s, m, v}))
      for (const Instruction& i : step) {
        if (i.op == Op::kBackward && !backward_seen) {
          backward_seen = true;
          // The steady step pairs the warm-up's next forward with the first backward.
          EXPECT_EQ(forwards, (p - s - 1) * 2 + (v - 1) * p + 1) << "stage " << s;
        }
        if (i.op != Op::kForward) continue;
        EXPECT_EQ(i.chunk, (k / p) % v) << "stage " << s << " forward " << k;
        EXPECT_EQ(i.micro_batch, (k / (p * v)) * p + k % p) << "stage " << s << " forward " << k;
        ++forwards, ++k;
      }
  }
}

TEST(Schedule, InterleavedRefusesWithTheArithmetic) {
  try {
    train_schedule({4, 0, 6, 2});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("micro_batches = 6, stages = 4 (6 % 4 = 2)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(train_schedule({4, 0, 2, 2}), Error);
  EXPECT_THROW(train_schedule({1, 0, 4, 2}), Error);
}

}  // namespace
}  // namespace dscpp::pipe

namespace dscpp::pipe {
namespace {

// ZB-H1: the contract; with F = 1, B = 2 and W = 1 (B's input half 1), each stage's idle time
// in the event simulation over its ideal 3m is the formula, (p - 1)/(3m) for m >= p, a third
// of 1F1B's; the activations held are 1F1B's: at most p - s micro-batches between forward and
// B on stage s, at most p between forward and W (stage 0's p in 1F1B).
void check_zero_bubble_h1(int p, int m) {
  SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m);
  const auto pipe = testing::build(p, m, 1, true, ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(testing::check_contract(pipe), "");
  const auto timing = testing::simulate(pipe, 1.0, 2.0, 1.0);
  const double formula = bubble_fraction({p, 0, m, 1, ScheduleKind::kZeroBubbleH1});
  if (m >= p) {
    EXPECT_DOUBLE_EQ(formula, (p - 1.0) / (3.0 * m));
  }
  const auto one_f_one_b = testing::build(p, m, 1, true);
  for (int s = 0; s < p; ++s) {
    EXPECT_NEAR(timing.busy[s], m * 3.0, 1e-9);
    EXPECT_NEAR((timing.makespan - timing.busy[s]) / timing.busy[s], formula, 1e-12)
        << "stage " << s;
    const auto held = testing::in_flight(pipe, s);
    EXPECT_LE(held.until_backward, testing::in_flight(one_f_one_b, s).until_backward)
        << "stage " << s;
    EXPECT_LE(held.until_weight, std::min(p, m)) << "stage " << s;
  }
}

TEST(Schedule, ZeroBubbleH1KeepsTheContractAndAThirdOf1F1BsBubble) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 7, 8, 16}) check_zero_bubble_h1(p, m);
}

TEST(ScheduleGrid, ZeroBubbleH1EveryShape) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m = 1; m <= 32; ++m) check_zero_bubble_h1(p, m);
}

// The order on 4 stages, 8 micro-batches: stage 0 runs 1F1B's warm-up and each W right after
// its B; the last stage runs F and B alternately and puts its W's off to the end.
TEST(Schedule, ZeroBubbleH1Order) {
  auto order = [](int s) {
    std::string out;
    for (const Step& step : train_schedule({4, s, 8, 1, ScheduleKind::kZeroBubbleH1}))
      for (const Instruction& i : step) {
        const char* op = i.op == Op::kForward          ? "F"
                         : i.op == Op::kBackwardInput  ? "B"
                         : i.op == Op::kBackwardWeight ? "W"
                                                       : nullptr;
        if (op) out += op + std::to_string(i.micro_batch) + " ";
      }
    return out;
  };
  EXPECT_EQ(order(0), "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7 ");
  EXPECT_EQ(order(3), "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7 ");
}

TEST(Schedule, ZeroBubbleKindsAndRefusals) {
  EXPECT_EQ(parse_schedule_kind("zb-h1"), ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(to_string(ScheduleKind::kInterleaved), "interleaved");
  EXPECT_THROW(parse_schedule_kind("gpipe"), Error);
  EXPECT_EQ(parse_schedule_kind("zb-v"), ScheduleKind::kZeroBubbleV);
  // ZB-H1 and 1F1B run one chunk per stage; interleaved needs several.
  EXPECT_THROW(train_schedule({4, 0, 8, 2, ScheduleKind::kZeroBubbleH1}), Error);
  EXPECT_THROW(train_schedule({4, 0, 8, 2, ScheduleKind::kOneFOneB}), Error);
  EXPECT_THROW(train_schedule({4, 0, 8, 1, ScheduleKind::kInterleaved}), Error);
  EXPECT_EQ(to_string(Instruction{Op::kBackwardWeight, 3, 0, 1}),
            "BackwardWeightPass(micro_batch=3, chunk=0, buffer=1)");
}

}  // namespace
}  // namespace dscpp::pipe

namespace dscpp::pipe {
namespace {

// ZB-V: two chunks per stage in a V (stage s holds virtual stages s and 2p - 1 - s). The
// contract; with F = 1, B = 2 and W = 1 per stage (half of each per chunk) each stage's idle
// time over its ideal 3m is the schedule's bubble, (p - 1)/(6m) for m >= 2p - 1, half of
// ZB-H1's; at most p micro-batches' activations held (2p chunks), 1F1B's most.
void check_zero_bubble_v(int p, int m) {
  SCOPED_TRACE(::testing::Message() << "p=" << p << " m=" << m);
  const auto pipe = testing::build(p, m, 2, true, ScheduleKind::kZeroBubbleV);
  EXPECT_EQ(testing::check_contract(pipe), "");
  const auto timing = testing::simulate(pipe, 1.0, 2.0, 1.0);
  const double formula = bubble_fraction({p, 0, m, 2, ScheduleKind::kZeroBubbleV});
  if (m >= 2 * p - 1) {
    EXPECT_NEAR(formula, (p - 1.0) / (6.0 * m), 1e-12);
  }
  for (int s = 0; s < p; ++s) {
    EXPECT_NEAR(timing.busy[s], m * 3.0, 1e-9);
    EXPECT_NEAR((timing.makespan - timing.busy[s]) / timing.busy[s], formula, 1e-12)
        << "stage " << s;
    EXPECT_LE(testing::in_flight(pipe, s).until_weight, 2 * std::min(p, m)) << "stage " << s;
  }
  const auto inference = testing::build(p, m, 2, false, ScheduleKind::kZeroBubbleV);
  EXPECT_EQ(testing::check_contract(inference), "");
}

TEST(Schedule, ZeroBubbleVKeepsTheContractAndHalfOfZBH1sBubble) {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 4, 7, 8, 16}) check_zero_bubble_v(p, m);
}

TEST(ScheduleGrid, ZeroBubbleVEveryShape) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m = 1; m <= 32; ++m) check_zero_bubble_v(p, m);
}

// The V: stage 0 holds the first and the last virtual stage, stage p - 1 the two middle ones,
// which hand activations and gradients to each other on the stage itself.
TEST(Schedule, ZeroBubbleVPlacesChunksInAV) {
  const PipeShape shape{4, 3, 8, 2, ScheduleKind::kZeroBubbleV};
  EXPECT_EQ(virtual_stage(shape, 0, 0), 0);
  EXPECT_EQ(virtual_stage(shape, 0, 1), 7);
  EXPECT_EQ(virtual_stage(shape, 3, 0), 3);
  EXPECT_EQ(virtual_stage(shape, 3, 1), 4);
  EXPECT_EQ(place_of(shape, 5).stage, 2);
  EXPECT_EQ(place_of(shape, 5).chunk, 1);
  const Peer local = peer_of(shape, {Op::kSendActivation, 0, 0, 0});
  EXPECT_EQ(local.stage, 3);
  EXPECT_EQ(local.chunk, 1);
  EXPECT_THROW(train_schedule({4, 0, 8, 1, ScheduleKind::kZeroBubbleV}), Error);
}

}  // namespace
}  // namespace dscpp::pipe
