// lay_out: every stage's work on common steps as early as dependencies allow; steps_from_grid:
// such a grid turned into one stage's instruction list (schedule_internal.h). Shared by the
// interleaved and zero-bubble schedules.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "dscpp/error.h"
#include "dscpp/pipe/schedule_internal.h"

namespace dscpp::pipe {
namespace {

bool sends_grad(Op op) {
  return op == Op::kBackward || op == Op::kBackwardInput;
}

}  // namespace

Grid lay_out(const PipeShape& shape, const std::vector<std::vector<std::vector<Work>>>& order,
             const char* what) {
  const int p = shape.stages;
  const int last_vs = p * shape.chunks - 1;
  // (0 forward, 1 backward or its B, 2 W; micro-batch; virtual stage) -> its step
  using Key = std::tuple<int, int, int>;
  auto kind = [](Op op) { return op == Op::kForward ? 0 : op == Op::kBackwardWeight ? 2 : 1; };
  std::map<Key, int> done;
  std::vector<size_t> next(order.size(), 0);
  Grid grid(p);
  for (int t = 0;; ++t) {
    bool left = false, moved = false;
    std::vector<Key> finished;
    for (int s = 0; s < p; ++s) {
      grid[s].emplace_back();
      if (next[s] == order[s].size()) continue;
      left = true;
      const auto& group = order[s][next[s]];
      bool ready = true;
      std::vector<Key> here;
      for (const Work& w : group) {
        const int vs = virtual_stage(shape, s, w.chunk), k = kind(w.op);
        std::optional<Key> dep;
        if (k == 0 && vs > 0) dep = Key{0, w.micro_batch, vs - 1};
        if (k == 1) dep = vs == last_vs ? Key{0, w.micro_batch, vs} : Key{1, w.micro_batch, vs + 1};
        if (k == 2) dep = Key{1, w.micro_batch, vs};
        if (dep) {
          auto it = done.find(*dep);
          const bool local = std::find(here.begin(), here.end(), *dep) != here.end();
          if (!local && (it == done.end() || it->second > t - 1)) ready = false;
        }
        here.emplace_back(k, w.micro_batch, vs);
      }
      if (!ready) continue;
      grid[s].back() = group;
      finished.insert(finished.end(), here.begin(), here.end());
      ++next[s];
      moved = true;
    }
    if (!left) {
      for (auto& column : grid) column.pop_back();
      return grid;
    }
    if (!moved)
      throw Error(fmt::format("pipeline schedule: {} layout stuck at step {} (a bug)", what, t));
    for (const Key& k : finished) done[k] = t;
  }
}

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
