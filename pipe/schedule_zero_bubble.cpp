// ZB-H1 and ZB-V, the zero-bubble paper's schedules with 1F1B's activation memory (Qi et al.,
// "Zero Bubble Pipeline Parallelism", ICLR 2024), as aligned steps.
//
// ZB-H1:
// Every backward is split into B (the input's gradient, which the previous stage waits for)
// and W (the parameters' gradients, which nothing waits for). The steps are laid out for all
// stages together, one unit of compute per stage per step, each stage taking in each step the
// first of these that it may:
//   F: the next micro-batch's forward, once its input was computed by the step before, while
//      fewer than p - s micro-batches are between their forward and their B on stage s (1F1B's
//      count: the activations B still needs) and fewer than p between forward and W;
//   B: the oldest forward's B, once the next stage's B of it was computed by the step before;
//   W: the oldest B's W.
// With F, B and W of one cost, stage s then idles s steps before its first forward and
// p - 1 - s after its last W: (p - 1) steps of 3m, where 1F1B's fused backward idles 3(p - 1)
// (for m >= p; tests/pipe check it by event simulation). On stage 0 the W's run right after
// their B's; later stages put them off, up to s of them, into the steps where 1F1B idles at the
// end. The most activations any stage holds is stage 0's p, as in 1F1B; stage s holds p - s
// micro-batches' activations whose B has not run, and up to s whose W has not.
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "dscpp/error.h"
#include "dscpp/pipe/schedule_internal.h"

namespace dscpp::pipe {

std::vector<Step> zero_bubble_h1_schedule(const PipeShape& shape) {
  const int p = shape.stages, m = shape.micro_batches;
  struct State {
    int forwards = 0, backwards = 0, weights = 0;
    std::deque<int> pending_w;
  };
  std::vector<State> state(p);
  std::map<std::tuple<Op, int, int>, int> done;  // (op, stage, micro-batch) -> its step
  auto done_by = [&](Op op, int stage, int mb, int t) {
    auto it = done.find({op, stage, mb});
    return it != done.end() && it->second <= t;
  };
  Grid grid(p);
  int left = p * m;  // W's still to run
  for (int t = 0; left > 0; ++t) {
    if (t > 3 * (m + p) + 3)
      throw Error(fmt::format("pipeline schedule: ZB-H1 layout stuck at step {} (a bug)", t));
    std::vector<std::tuple<Op, int, int>> finished;
    for (int s = 0; s < p; ++s) {
      State& st = state[s];
      grid[s].emplace_back();
      const int f = st.forwards, b = st.backwards;
      const bool can_f = f < m && (s == 0 || done_by(Op::kForward, s - 1, f, t - 1)) &&
                         f - b < p - s && f - st.weights < p;
      const bool can_b = b < f && done_by(Op::kForward, s, b, t - 1) &&
                         (s == p - 1 || done_by(Op::kBackwardInput, s + 1, b, t - 1));
      Work w{};
      if (can_f) {
        w = {Op::kForward, 0, f};
        ++st.forwards;
      } else if (can_b) {
        w = {Op::kBackwardInput, 0, b};
        ++st.backwards;
        st.pending_w.push_back(b);
      } else if (!st.pending_w.empty()) {
        w = {Op::kBackwardWeight, 0, st.pending_w.front()};
        st.pending_w.pop_front();
        ++st.weights;
        --left;
      } else {
        continue;
      }
      grid[s].back().push_back(w);
      finished.emplace_back(w.op, s, w.micro_batch);
    }
    for (const auto& k : finished) done[k] = t;
  }
  return steps_from_grid(shape, grid, /*training=*/true);
}

// ZB-V: each stage's order of work is PyTorch's ZBV order (torchtitan's ZBVZeroBubble), for
// stage r of p with n = max(m, 2p - 1) (micro-batches past m dropped at the end):
//   2(p - r) - 1 forwards of chunk 0; r times a forward of chunk 1 and one of chunk 0;
//   p - r times F, B, W of chunk 1; then, while chunk 1 trails chunk 0 or chunk 0 has
//   forwards left: [F of chunk 0], B, W of chunk 0, F, B, W of chunk 1; then r times B of
//   chunk 0 and B of chunk 1; p - r times B and W of chunk 0; the W's left, chunk 1's first.
// The orders are laid out together, each stage taking its next unit in step t when what it
// needs was computed by step t - 1, idle otherwise.
Grid zero_bubble_v_grid(const PipeShape& shape) {
  const int p = shape.stages, m = shape.micro_batches, n = std::max(m, 2 * p - 1);
  std::vector<std::vector<Work>> order(p);
  for (int r = 0; r < p; ++r) {
    auto& o = order[r];
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto add = [&](Op op, int chunk, int& counter) { o.push_back({op, chunk, counter++}); };
    auto add_w = [&](int chunk, int mb) { o.push_back({Op::kBackwardWeight, chunk, mb}); };
    for (int i = 0; i < 2 * (p - r) - 1; ++i) add(Op::kForward, 0, f0);
    for (int i = 0; i < r; ++i) {
      add(Op::kForward, 1, f1);
      add(Op::kForward, 0, f0);
    }
    for (int i = 0; i < p - r; ++i) {
      add(Op::kForward, 1, f1);
      o.push_back({Op::kBackwardInput, 1, b1});
      add_w(1, b1++);
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(Op::kForward, 0, f0);
      o.push_back({Op::kBackwardInput, 0, b0});
      add_w(0, b0++);
      add(Op::kForward, 1, f1);
      o.push_back({Op::kBackwardInput, 1, b1});
      add_w(1, b1++);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; ++i) {
      add(Op::kBackwardInput, 0, b0);
      add(Op::kBackwardInput, 1, b1);
    }
    for (int i = 0; i < p - r; ++i) {
      add(Op::kBackwardInput, 0, b0);
      add_w(0, w0++);
    }
    while (w1 < b1) add_w(1, w1++);
    while (w0 < b0) add_w(0, w0++);
    o.erase(std::remove_if(o.begin(), o.end(), [m](const Work& w) { return w.micro_batch >= m; }),
            o.end());
  }

  std::vector<std::vector<std::vector<Work>>> groups(p);
  for (int r = 0; r < p; ++r)
    for (const Work& w : order[r]) groups[r].push_back({w});
  return lay_out(shape, groups, "ZB-V");
}

std::vector<Step> zero_bubble_v_schedule(const PipeShape& shape) {
  return steps_from_grid(shape, zero_bubble_v_grid(shape), /*training=*/true);
}

}  // namespace dscpp::pipe
