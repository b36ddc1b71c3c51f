// Megatron's interleaved 1F1B (forward_backward_pipelining_with_interleaving) as aligned
// steps. Each rank holds v chunks; virtual stage c * p + s is chunk c of stage s.
//
// How the alignment is kept: every rank runs Megatron's order of compute, grouped as
// Megatron's loop groups it: w_s warm-up forwards one per step, then steady steps of one
// forward and one backward, then w_s cool-down backwards one per step. The steps of all
// ranks are laid out together, as early as dependencies allow: a rank takes its next group
// in step t when every input was computed by step t - 1 (a chunk's input on its own rank
// in the same step counts, for the last virtual stage's forward then backward), and is idle
// in step t otherwise. An activation travels in the step its consumer computes it, a
// gradient in the step after its producer computed it; both ends list the transfer in the
// same step, so the steps stay aligned whatever the ranks compute. With all ranks doing the
// same work per steady step, a step's rendezvous costs nothing there, and an event
// simulation gives Megatron's bubble, (p - 1)/(v m) of the ideal (tests/pipe).
#include <fmt/format.h>

#include "dscpp/error.h"
#include "dscpp/pipe/schedule_internal.h"

namespace dscpp::pipe {
namespace {

struct Unit {
  bool forward;
  int chunk, micro_batch;
};

// Megatron's order on stage s: the k-th forward runs chunk (k / p) % v of micro-batch
// (k / (p v)) p + k % p; the k-th backward the chunk v - 1 - (k / p) % v of the same.
std::vector<std::vector<Unit>> megatron_groups(int p, int s, int m, int v, bool forward_only) {
  const int total = m * v;
  auto nth = [&](int k, bool fwd) {
    const int c = (k / p) % v;
    return Unit{fwd, fwd ? c : v - 1 - c, (k / (p * v)) * p + k % p};
  };
  std::vector<std::vector<Unit>> groups;
  if (forward_only) {  // Megatron's forward-only path: every forward in order, one per step
    for (int k = 0; k < total; ++k) groups.push_back({nth(k, true)});
    return groups;
  }
  const int warmup = std::min((p - s - 1) * 2 + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) groups.push_back({nth(k, true)});
  for (int i = 0; i < total - warmup; ++i) groups.push_back({nth(warmup + i, true), nth(i, false)});
  for (int i = total - warmup; i < total; ++i) groups.push_back({nth(i, false)});
  return groups;
}

}  // namespace

std::vector<Step> interleaved_schedule(const PipeShape& shape, bool forward_only) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  if (p < 2)
    throw Error(fmt::format(
        "pipeline schedule: interleaved 1F1B (chunks = {}) needs at least 2 stages, found "
        "stages = 1 (one stage holds all layers: use chunks = 1)",
        v));
  if (m < p || m % p != 0)
    throw Error(fmt::format(
        "pipeline schedule: interleaved 1F1B (chunks = {}) needs micro_batches "
        "(gradient_accumulation_steps) to be a multiple of stages, at least stages: found "
        "micro_batches = {}, stages = {} ({} % {} = {})",
        v, m, p, m, p, m % p));
  // Every rank's groups laid out together, as early as dependencies allow.
  std::vector<std::vector<std::vector<Work>>> order(p);
  for (int s = 0; s < p; ++s)
    for (const auto& group : megatron_groups(p, s, m, v, forward_only)) {
      order[s].emplace_back();
      for (const Unit& w : group)
        order[s].back().push_back(
            {w.forward ? Op::kForward : Op::kBackward, w.chunk, w.micro_batch});
    }
  const Grid grid = lay_out(shape, order, "interleaved");
  return steps_from_grid(shape, grid, !forward_only);
}

}  // namespace dscpp::pipe
