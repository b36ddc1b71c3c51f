// ZB-H1, the zero-bubble paper's schedule with 1F1B's activation memory (Qi et al., "Zero
// Bubble Pipeline Parallelism", ICLR 2024), as aligned steps.
//
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

}  // namespace dscpp::pipe
