// The checker behind tests/pipe/schedule_check.h: a replay of every stage's list, step by
// step, holding what each stage has computed, received and which slot holds what.
#include "tests/pipe/schedule_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace dscpp::pipe::testing {
namespace {

bool transfer(Op op) {
  return op == Op::kSendActivation || op == Op::kRecvActivation || op == Op::kSendGrad ||
         op == Op::kRecvGrad;
}
bool compute(Op op) {
  return op == Op::kLoadMicroBatch || op == Op::kForward || op == Op::kBackward ||
         op == Op::kBackwardInput || op == Op::kBackwardWeight;
}
int rank_of(Op op) {
  return transfer(op) ? 0 : compute(op) ? 1 : 2;
}
Op matching(Op op) {
  switch (op) {
    case Op::kSendActivation:
      return Op::kRecvActivation;
    case Op::kRecvActivation:
      return Op::kSendActivation;
    case Op::kSendGrad:
      return Op::kRecvGrad;
    default:
      return Op::kSendGrad;
  }
}

// What one stage has done to one (micro-batch, chunk): the step of each event, -1 if not yet.
struct Unit {
  int loaded = -1, received = -1, forward = -1, grad_received = -1, backward = -1;
  int weight = -1;  // a split backward's W
  bool split = false;
  int sent_act = -1, sent_grad = -1;
  int buffer = -1, first = -1, last = -1;  // the slot and the steps it is held
};

}  // namespace

Pipeline build(int stages, int micro_batches, int chunks, bool training, ScheduleKind kind) {
  Pipeline pipe{stages, micro_batches, chunks, training, {}, kind};
  for (int s = 0; s < stages; ++s) {
    const PipeShape shape{stages, s, micro_batches, chunks, kind};
    pipe.lists.push_back(training ? train_schedule(shape) : inference_schedule(shape));
  }
  return pipe;
}

std::string check_contract(const Pipeline& pipe) {
  const int p = pipe.stages, m = pipe.micro_batches, v = pipe.chunks;
  const size_t steps = pipe.lists[0].size();
  for (int s = 0; s < p; ++s)
    if (pipe.lists[s].size() != steps)
      return fmt::format("stage {} has {} steps, stage 0 has {}", s, pipe.lists[s].size(), steps);
  auto where = [](size_t t, int s, const Instruction& i) {
    return fmt::format("step {}, stage {}, {}", t, s, to_string(i));
  };
  auto shape = [&](int s) { return PipeShape{p, s, m, v, pipe.kind}; };

  // Order inside a step, step-level ops only at the end of the last step.
  for (int s = 0; s < p; ++s) {
    for (size_t t = 0; t < steps; ++t) {
      const Step& step = pipe.lists[s][t];
      for (size_t k = 1; k < step.size(); ++k)
        if (rank_of(step[k].op) < rank_of(step[k - 1].op))
          return where(t, s, step[k]) + ": out of order (transfers, compute, step-level)";
      std::vector<Op> tail;
      for (const Instruction& i : step)
        if (rank_of(i.op) == 2) tail.push_back(i.op);
      const bool last = t + 1 == steps;
      const std::vector<Op> want =
          (pipe.training && last)
              ? std::vector<Op>{Op::kReduceTiedGrads, Op::kReduceGrads, Op::kOptimizerStep}
              : std::vector<Op>{};
      if (tail != want) return fmt::format("step {}, stage {}: wrong step-level ops", t, s);
    }
  }

  // Matching: per link (unordered stage pair) the transfers of a step, in list order.
  for (size_t t = 0; t < steps; ++t) {
    std::map<std::pair<int, int>, std::vector<std::tuple<Op, int, int>>> link;  // (from, to) -> ops
    for (int s = 0; s < p; ++s) {
      for (const Instruction& i : pipe.lists[s][t]) {
        if (!transfer(i.op)) continue;
        const Peer q = peer_of(shape(s), i);
        // Canonical form of the transfer: the sender's op, micro-batch, sender's chunk.
        const bool send = i.op == Op::kSendActivation || i.op == Op::kSendGrad;
        const auto canon = send ? std::make_tuple(i.op, i.micro_batch, i.chunk)
                                : std::make_tuple(matching(i.op), i.micro_batch, q.chunk);
        link[{s, q.stage}].push_back(canon);
      }
    }
    for (const auto& [ends, ops] : link) {
      if (ends.first == ends.second) {
        // Between two chunks of one stage: each transfer listed twice, as send and receive.
        std::map<std::tuple<Op, int, int>, int> count;
        for (const auto& op : ops) ++count[op];
        for (const auto& [op, n] : count)
          if (n != 2)
            return fmt::format(
                "step {}: stage {} sends to itself without receiving (or the "
                "reverse)",
                t, ends.first);
        continue;
      }
      auto other = link.find({ends.second, ends.first});
      if (other == link.end() || other->second != ops)
        return fmt::format(
            "step {}: the transfers of stage {} with stage {} do not match its peer's (count "
            "or order)",
            t, ends.first, ends.second);
    }
  }

  // Dependencies and buffers, replaying each stage.
  for (int s = 0; s < p; ++s) {
    std::map<std::pair<int, int>, Unit> units;
    for (size_t t = 0; t < steps; ++t) {
      for (const Instruction& i : pipe.lists[s][t]) {
        if (i.micro_batch < 0) continue;
        if (i.micro_batch >= m || i.chunk < 0 || i.chunk >= v)
          return where(t, s, i) + ": out of range";
        const int vs = virtual_stage(shape(s), s, i.chunk), first_vs = 0, last_vs = p * v - 1;
        Unit& u = units[{i.micro_batch, i.chunk}];
        const int st = static_cast<int>(t);
        if (u.buffer < 0) u.buffer = i.buffer, u.first = st;
        if (i.buffer != u.buffer)
          return where(t, s, i) + fmt::format(": the unit was in slot {}", u.buffer);
        u.last = st;
        auto once = [&](int& slot) {
          if (slot >= 0) return false;
          slot = st;
          return true;
        };
        switch (i.op) {
          case Op::kLoadMicroBatch:
            if (vs != first_vs && vs != last_vs)
              return where(t, s, i) + ": a load off the first and last stage";
            if (!once(u.loaded)) return where(t, s, i) + ": loaded twice";
            break;
          case Op::kRecvActivation:
            if (vs == first_vs || !once(u.received)) return where(t, s, i) + ": unexpected";
            break;
          case Op::kForward:
            if ((vs == first_vs && u.loaded < 0) || (vs != first_vs && u.received < 0))
              return where(t, s, i) + ": forward before its input";
            if (vs == last_vs && pipe.training && u.loaded < 0)
              return where(t, s, i) + ": forward before labels";
            if (!once(u.forward)) return where(t, s, i) + ": forward twice";
            break;
          case Op::kSendActivation:
            if (vs == last_vs || u.forward < 0 || u.forward >= st)
              return where(t, s, i) + ": send before forward";
            if (!once(u.sent_act)) return where(t, s, i) + ": sent twice";
            break;
          case Op::kRecvGrad:
            if (vs == last_vs || u.forward < 0 || !once(u.grad_received))
              return where(t, s, i) + ": unexpected";
            break;
          case Op::kBackward:
          case Op::kBackwardInput:
            if (!pipe.training || u.forward < 0)
              return where(t, s, i) + ": backward before forward";
            if (vs != last_vs && u.grad_received < 0)
              return where(t, s, i) + ": backward before its gradient";
            if (!once(u.backward)) return where(t, s, i) + ": backward twice";
            u.split = i.op == Op::kBackwardInput;
            break;
          case Op::kBackwardWeight:
            if (!u.split || u.backward < 0) return where(t, s, i) + ": W before its B";
            if (!once(u.weight)) return where(t, s, i) + ": W twice";
            break;
          case Op::kSendGrad:
            if (vs == first_vs || u.backward < 0 || u.backward >= st)
              return where(t, s, i) + ": send before backward";
            if (!once(u.sent_grad)) return where(t, s, i) + ": sent twice";
            break;
          default:
            break;
        }
      }
    }
    // Completeness.
    for (int b = 0; b < m; ++b) {
      for (int c = 0; c < v; ++c) {
        const int vs = virtual_stage(shape(s), s, c);
        auto it = units.find({b, c});
        if (it == units.end())
          return fmt::format("stage {}: micro-batch {} chunk {} never runs", s, b, c);
        const Unit& u = it->second;
        const bool need_act = vs != p * v - 1, need_grad = pipe.training && vs != 0;
        if (u.forward < 0 || (pipe.training && u.backward < 0) || (u.split && u.weight < 0) ||
            (need_act && u.sent_act < 0) || (need_grad && u.sent_grad < 0) ||
            (pipe.training && need_act && u.grad_received < 0))
          return fmt::format("stage {}: micro-batch {} chunk {} incomplete", s, b, c);
      }
    }
    // Slots: two units in one slot never overlap (held from first to last instruction).
    int slots = num_buffers(pipe.lists[s]);
    std::vector<std::vector<std::pair<int, int>>> held(std::max(slots, 0));
    for (const auto& [key, u] : units) {
      if (u.buffer < 0 || u.buffer >= slots)
        return fmt::format("stage {}: slot {} out of range", s, u.buffer);
      for (const auto& [a, b] : held[u.buffer])
        if (!(u.last < a || b < u.first))
          return fmt::format(
              "stage {}: slot {} holds micro-batch {} chunk {} (steps {}..{}) while live (steps "
              "{}..{})",
              s, u.buffer, key.first, key.second, u.first, u.last, a, b);
      held[u.buffer].push_back({u.first, u.last});
    }
  }
  return "";
}

Timing simulate(const Pipeline& pipe, double F, double B, double W) {
  const int p = pipe.stages;
  const size_t steps = pipe.lists[0].size();
  const double f = F / pipe.chunks, b = B / pipe.chunks, w = W / pipe.chunks;
  std::vector<double> ready(p, 0.0), busy(p, 0.0);
  for (size_t t = 0; t < steps; ++t) {
    std::vector<double> next(p);
    for (int s = 0; s < p; ++s) {
      double start = ready[s];
      double work = 0;
      for (const Instruction& i : pipe.lists[s][t]) {
        if (transfer(i.op))
          start = std::max(
              start, ready[peer_of({p, s, pipe.micro_batches, pipe.chunks, pipe.kind}, i).stage]);
        if (i.op == Op::kForward) work += f;
        if (i.op == Op::kBackward) work += b;
        if (i.op == Op::kBackwardInput) work += b - w;
        if (i.op == Op::kBackwardWeight) work += w;
      }
      next[s] = start + work;
      busy[s] += work;
    }
    ready = next;
  }
  return {*std::max_element(ready.begin(), ready.end()), busy};
}

InFlight in_flight(const Pipeline& pipe, int stage) {
  InFlight most;
  int forwards = 0, backwards = 0, weights = 0;
  for (const Step& step : pipe.lists[stage])
    for (const Instruction& i : step) {
      forwards += i.op == Op::kForward;
      backwards += i.op == Op::kBackward || i.op == Op::kBackwardInput;
      weights += i.op == Op::kBackward || i.op == Op::kBackwardWeight;
      most.until_backward = std::max(most.until_backward, forwards - backwards);
      most.until_weight = std::max(most.until_weight, forwards - weights);
    }
  return most;
}

}  // namespace dscpp::pipe::testing
