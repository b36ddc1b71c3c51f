// DeepSpeed's TrainSchedule (plain 1F1B) and InferenceSchedule as instruction lists, and
// the helpers every schedule shares (validation, peers, buffer counts, names).
#include "dscpp/pipe/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "dscpp/error.h"
#include "dscpp/pipe/schedule_internal.h"

namespace dscpp::pipe {
namespace {

bool is_even(int x) {
  return x % 2 == 0;
}

// DeepSpeed's TrainSchedule._step_to_micro_batch: on even stages even steps are forward
// steps and odd steps backward steps, on odd stages the reverse, so that neighbours are
// always in opposite phases. Forward of micro-batch b on stage s falls on step 2b + s, its
// backward on step 2b + 2p - 1 - s. The id may be out of range (an idle step).
struct StepRole {
  int micro_batch;
  bool is_forward;
};
StepRole step_to_micro_batch(int step, int stage, int stages) {
  if (is_even(step) && is_even(stage)) return {step / 2 - stage / 2, true};
  if (!is_even(step) && !is_even(stage)) return {(step - 1) / 2 - stage / 2, true};
  if (is_even(step) && !is_even(stage)) return {step / 2 - stages + (stage + 1) / 2, false};
  return {(step - 1) / 2 - stages + 1 + stage / 2, false};
}

// Slots for plain 1F1B: a slot holds a micro-batch from its RecvActivation (or load) through
// the SendGrad one step after its backward. The stage runs p - s micro-batches in flight, as
// DeepSpeed's num_pipe_buffers = max(2, min(p - s, m)) counts; on a middle stage DeepSpeed's
// count lets the SendGrad of micro-batch b and the RecvActivation of b + (p - s) share step
// and slot, harmless for its sequential, cloning executor but a hazard when a step's
// transfers are issued together into reused buffers: middle stages get one slot more.
int one_f_one_b_slots(const PipeShape& s) {
  const bool middle = s.stage > 0 && s.stage < s.stages - 1;
  return std::max(2, std::min(s.stages - s.stage + (middle ? 1 : 0), s.micro_batches));
}

}  // namespace

void validate(const PipeShape& s) {
  if (s.stages < 1)
    throw Error(fmt::format("pipeline schedule: stages must be >= 1, found {}", s.stages));
  if (s.stage < 0 || s.stage >= s.stages)
    throw Error(
        fmt::format("pipeline schedule: stage must be in 0..{}, found {}", s.stages - 1, s.stage));
  if (s.micro_batches < 1)
    throw Error(fmt::format(
        "pipeline schedule: micro_batches (gradient_accumulation_steps) must be >= 1, found {}",
        s.micro_batches));
  if (s.chunks < 1)
    throw Error(fmt::format("pipeline schedule: chunks must be >= 1, found {}", s.chunks));
  if (s.kind == ScheduleKind::kInterleaved && s.chunks < 2)
    throw Error(
        "pipeline schedule: \"interleaved\" needs several model chunks per stage "
        "(PipelineOptions::num_chunks, train_gpt --pipeline-chunks), found 1");
  if (s.kind == ScheduleKind::kZeroBubbleV && s.chunks != 2)
    throw Error(
        fmt::format("pipeline schedule: \"zb-v\" runs two model chunks per stage placed in a V "
                    "(PipelineOptions::num_chunks(2).v_shape(true)), found chunks = {}",
                    s.chunks));
  if ((s.kind == ScheduleKind::kOneFOneB || s.kind == ScheduleKind::kZeroBubbleH1) && s.chunks > 1)
    throw Error(fmt::format(
        "pipeline schedule: \"{}\" runs one model chunk per stage, found chunks = {} (use "
        "\"interleaved\" or \"auto\" with several)",
        to_string(s.kind), s.chunks));
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "auto") return ScheduleKind::kAuto;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  if (name == "zb-h1") return ScheduleKind::kZeroBubbleH1;
  if (name == "zb-v") return ScheduleKind::kZeroBubbleV;
  throw Error(fmt::format(
      "pipeline schedule \"{}\": expected \"auto\", \"1f1b\", \"interleaved\", \"zb-h1\" "
      "or \"zb-v\"",
      name));
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kAuto:
      return "auto";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
    case ScheduleKind::kZeroBubbleV:
      return "zb-v";
  }
  return "?";
}

std::vector<Step> train_schedule(const PipeShape& shape) {
  validate(shape);
  if (shape.kind == ScheduleKind::kZeroBubbleH1) return zero_bubble_h1_schedule(shape);
  if (shape.kind == ScheduleKind::kZeroBubbleV) return zero_bubble_v_schedule(shape);
  if (shape.chunks > 1) return interleaved_schedule(shape, false);
  const int p = shape.stages, s = shape.stage, m = shape.micro_batches;
  const int slots = one_f_one_b_slots(shape);
  auto valid = [m](int b) { return b >= 0 && b < m; };
  const bool has_prev = s > 0, has_next = s < p - 1;
  const int total = 2 * (m + p - 1);
  std::vector<Step> steps(total);
  int prev_mb = -1;
  for (int t = 0; t < total; ++t) {
    const auto [mb, fwd] = step_to_micro_batch(t, s, p);
    Step& cmds = steps[t];
    auto at = [slots](Op op, int b) { return Instruction{op, b, 0, b % slots}; };
    // Transfers first, in DeepSpeed's order: a forward step returns the previous step's
    // input gradient and takes this step's input; a backward step the reverse direction.
    if (fwd) {
      if (valid(prev_mb) && has_prev) cmds.push_back(at(Op::kSendGrad, prev_mb));
      if (valid(mb) && has_prev) cmds.push_back(at(Op::kRecvActivation, mb));
    } else {
      if (valid(mb) && has_next) cmds.push_back(at(Op::kRecvGrad, mb));
      if (valid(prev_mb) && has_next) cmds.push_back(at(Op::kSendActivation, prev_mb));
    }
    if ((s == 0 || s == p - 1) && fwd && valid(mb)) cmds.push_back(at(Op::kLoadMicroBatch, mb));
    if (valid(mb)) cmds.push_back(at(fwd ? Op::kForward : Op::kBackward, mb));
    prev_mb = mb;
  }
  append_step_level(steps.back());
  return steps;
}

std::vector<Step> inference_schedule(const PipeShape& shape) {
  validate(shape);
  if (v_shaped(shape)) {
    // ZB-V's placement forward only: each micro-batch down and back up the V, one virtual
    // stage a step.
    Grid grid(shape.stages);
    const int p = shape.stages, m = shape.micro_batches;
    for (int mb = 0; mb < m; ++mb)
      for (int vs = 0; vs < 2 * p; ++vs) {
        const Place at = place_of(shape, vs);
        auto& column = grid[at.stage];
        const int t = mb + vs;
        if (static_cast<int>(column.size()) <= t) column.resize(t + 1);
        column[t].push_back({Op::kForward, at.chunk, mb});
      }
    return steps_from_grid(shape, grid, /*training=*/false);
  }
  if (shape.chunks > 1) return interleaved_schedule(shape, true);
  const int p = shape.stages, s = shape.stage, m = shape.micro_batches;
  auto valid = [m](int b) { return b >= 0 && b < m; };
  const int total = m + p - 1;
  std::vector<Step> steps(total);
  for (int t = 0; t < total; ++t) {
    const int mb = t - s;
    // DeepSpeed's two alternating slots: a stage receives into one while it sends from the
    // other, which the previous step received into and computed.
    const int recv_buf = is_even(s) ? t % 2 : (t + 1) % 2;
    const int send_buf = 1 - recv_buf;
    Step& cmds = steps[t];
    if (s < p - 1 && valid(mb - 1)) cmds.push_back({Op::kSendActivation, mb - 1, 0, send_buf});
    if (s > 0 && valid(mb)) cmds.push_back({Op::kRecvActivation, mb, 0, recv_buf});
    if ((s == 0 || s == p - 1) && valid(mb)) cmds.push_back({Op::kLoadMicroBatch, mb, 0, recv_buf});
    if (valid(mb)) cmds.push_back({Op::kForward, mb, 0, recv_buf});
  }
  return steps;
}

void append_step_level(Step& last) {
  last.push_back({Op::kReduceTiedGrads});
  last.push_back({Op::kReduceGrads});
  last.push_back({Op::kOptimizerStep});
}

int num_buffers(const std::vector<Step>& steps) {
  int top = -1;
  for (const Step& step : steps)
    for (const Instruction& i : step) top = std::max(top, i.buffer);
  return top + 1;
}

bool is_transfer(Op op) {
  return op == Op::kSendActivation || op == Op::kRecvActivation || op == Op::kSendGrad ||
         op == Op::kRecvGrad;
}

Peer peer_of(const PipeShape& shape, const Instruction& instruction) {
  validate(shape);
  if (!is_transfer(instruction.op))
    throw Error(fmt::format("pipeline peer_of: {} is not a transfer", to_string(instruction)));
  const int p = shape.stages, v = shape.chunks;
  if (instruction.chunk < 0 || instruction.chunk >= v)
    throw Error(
        fmt::format("pipeline peer_of: {}: chunk must be in 0..{}", to_string(instruction), v - 1));
  // Activations go to the next virtual stage, gradients to the previous one.
  const int here = virtual_stage(shape, shape.stage, instruction.chunk);
  const bool downstream = instruction.op == Op::kSendActivation || instruction.op == Op::kRecvGrad;
  const int there = downstream ? here + 1 : here - 1;
  if (there < 0 || there >= p * v)
    throw Error(
        fmt::format("pipeline peer_of: {} on stage {} of {} has no peer (virtual stage {} of {})",
                    to_string(instruction), shape.stage, p, there, p * v));
  return place_of(shape, there);
}

bool v_shaped(const PipeShape& shape) {
  return shape.kind == ScheduleKind::kZeroBubbleV;
}

Place place_of(const PipeShape& shape, int vs) {
  const int p = shape.stages;
  // ZB-V: down the stages with chunk 0, back up with chunk 1. Megatron: round robin.
  if (v_shaped(shape)) return vs < p ? Place{vs, 0} : Place{2 * p - 1 - vs, 1};
  return {vs % p, vs / p};
}

int virtual_stage(const PipeShape& shape, int stage, int chunk) {
  if (v_shaped(shape)) return chunk == 0 ? stage : 2 * shape.stages - 1 - stage;
  return chunk * shape.stages + stage;
}

double bubble_fraction(const PipeShape& shape) {
  validate(shape);
  if (shape.kind == ScheduleKind::kZeroBubbleH1) {
    const int p = shape.stages, m = shape.micro_batches;
    return static_cast<double>(p - 1 + std::max(0, p - m)) / (3.0 * m);
  }
  if (shape.kind == ScheduleKind::kZeroBubbleV) {
    // Steps of one chunk's F, B or W; the ideal is 6m of them.
    const int m = shape.micro_batches;
    size_t steps = 0;
    for (const auto& stage : zero_bubble_v_grid(shape)) steps = std::max(steps, stage.size());
    return (static_cast<double>(steps) - 6.0 * m) / (6.0 * m);
  }
  return static_cast<double>(shape.stages - 1) /
         (static_cast<double>(shape.chunks) * shape.micro_batches);
}

std::string to_string(const Instruction& i) {
  const char* name = "?";
  switch (i.op) {
    case Op::kLoadMicroBatch:
      name = "LoadMicroBatch";
      break;
    case Op::kForward:
      name = "ForwardPass";
      break;
    case Op::kBackward:
      name = "BackwardPass";
      break;
    case Op::kBackwardInput:
      name = "BackwardInputPass";
      break;
    case Op::kBackwardWeight:
      name = "BackwardWeightPass";
      break;
    case Op::kSendActivation:
      name = "SendActivation";
      break;
    case Op::kRecvActivation:
      name = "RecvActivation";
      break;
    case Op::kSendGrad:
      name = "SendGrad";
      break;
    case Op::kRecvGrad:
      name = "RecvGrad";
      break;
    case Op::kReduceTiedGrads:
      name = "ReduceTiedGrads";
      break;
    case Op::kReduceGrads:
      name = "ReduceGrads";
      break;
    case Op::kOptimizerStep:
      name = "OptimizerStep";
      break;
  }
  if (i.micro_batch < 0) return fmt::format("{}()", name);
  return fmt::format("{}(micro_batch={}, chunk={}, buffer={})", name, i.micro_batch, i.chunk,
                     i.buffer);
}

}  // namespace dscpp::pipe
