// steps_from_grid: every stage's compute on common steps, turned into one stage's instruction
// list (schedule_internal.h). Shared by the interleaved and zero-bubble schedules.
#include <algorithm>
#include <map>
#include <tuple>

#include "dscpp/pipe/schedule_internal.h"

namespace dscpp::pipe {
namespace {

bool sends_grad(Op op) {
  return op == Op::kBackward || op == Op::kBackwardInput;
}

}  // namespace

std::vector<Step> steps_from_grid(const PipeShape& shape, const Grid& grid, bool training) {
  const int p = shape.stages, s = shape.stage;
  const int last_vs = p * shape.chunks - 1;
  int total_steps = 0;
  for (const auto& stage : grid)
    total_steps = std::max(total_steps, static_cast<int>(stage.size()));
  auto at = [&](int q, int t) -> const std::vector<Work>& {
    static const std::vector<Work> none;
    return t < static_cast<int>(grid[q].size()) ? grid[q][t] : none;
  };
  auto vs_of = [&](int stage, const Work& w) { return virtual_stage(shape, stage, w.chunk); };
  // A gradient computed in the last step leaves in one more.
  for (int q = 0; q < p; ++q)
    for (const Work& w : at(q, total_steps - 1))
      if (sends_grad(w.op) && vs_of(q, w) > 0) {
        ++total_steps;
        break;
      }

  // This stage's transfers (sorted by a key both ends compute alike, so the order per link
  // agrees), then the loads and compute of the step.
  struct Transfer {
    int key_kind, key_mb, key_sender;  // the sort key: activations first, then gradients
    Instruction ins;
  };
  std::vector<std::vector<Transfer>> transfers(total_steps);
  for (int t = 0; t < total_steps; ++t)
    for (const Work& w : at(s, t)) {
      const int vs = vs_of(s, w);
      if (w.op == Op::kForward && vs > 0)  // receive the input now, from the step before or earlier
        transfers[t].push_back(
            {0, w.micro_batch, vs - 1, {Op::kRecvActivation, w.micro_batch, w.chunk}});
      if (sends_grad(w.op) && vs > 0)  // return the input's gradient next step
        transfers[t + 1].push_back({1, w.micro_batch, vs, {Op::kSendGrad, w.micro_batch, w.chunk}});
    }
  // Sends of activations and receives of gradients follow from the peers' compute.
  for (int q = 0; q < p; ++q)
    for (int t = 0; t < total_steps; ++t)
      for (const Work& w : at(q, t)) {
        const int vs = vs_of(q, w);
        if (vs == 0) continue;
        const Place before = place_of(shape, vs - 1);
        if (before.stage != s) continue;
        if (w.op == Op::kForward)
          transfers[t].push_back(
              {0, w.micro_batch, vs - 1, {Op::kSendActivation, w.micro_batch, before.chunk}});
        if (sends_grad(w.op))
          transfers[t + 1].push_back(
              {1, w.micro_batch, vs, {Op::kRecvGrad, w.micro_batch, before.chunk}});
      }
  std::vector<Step> steps(total_steps);
  for (int t = 0; t < total_steps; ++t) {
    auto& list = transfers[t];
    std::stable_sort(list.begin(), list.end(), [](const Transfer& a, const Transfer& b) {
      return std::tie(a.key_kind, a.key_mb, a.key_sender) <
             std::tie(b.key_kind, b.key_mb, b.key_sender);
    });
    for (const Transfer& x : list) steps[t].push_back(x.ins);
    for (const Work& w : at(s, t)) {
      const int vs = vs_of(s, w);
      if (w.op == Op::kForward && (vs == 0 || vs == last_vs))
        steps[t].push_back({Op::kLoadMicroBatch, w.micro_batch, w.chunk});
      steps[t].push_back({w.op, w.micro_batch, w.chunk});
    }
  }

  // Slots: a (micro-batch, chunk) holds one from its first instruction to its last; slots go
  // to units in the order they start, each to the lowest slot free by then.
  std::map<std::pair<int, int>, std::pair<int, int>> span;  // unit -> (first, last) step
  for (int t = 0; t < total_steps; ++t)
    for (const Instruction& i : steps[t]) {
      auto [it, fresh] = span.try_emplace({i.micro_batch, i.chunk}, t, t);
      if (!fresh) it->second.second = t;
    }
  std::vector<std::tuple<int, int, int, int>> order;  // first, last, micro-batch, chunk
  for (const auto& [unit, range] : span)
    order.emplace_back(range.first, range.second, unit.first, unit.second);
  std::sort(order.begin(), order.end());
  std::vector<int> free_after;  // per slot: the last step of its latest unit
  std::map<std::pair<int, int>, int> slot;
  for (const auto& [first, last, mb, chunk] : order) {
    int chosen = -1;
    for (size_t k = 0; k < free_after.size() && chosen < 0; ++k)
      if (free_after[k] < first) chosen = static_cast<int>(k);
    if (chosen < 0) {
      chosen = static_cast<int>(free_after.size());
      free_after.push_back(0);
    }
    free_after[chosen] = last;
    slot[{mb, chunk}] = chosen;
  }
  for (Step& step : steps)
    for (Instruction& i : step) i.buffer = slot.at({i.micro_batch, i.chunk});
  if (training) append_step_level(steps.back());
  return steps;
}

}  // namespace dscpp::pipe
