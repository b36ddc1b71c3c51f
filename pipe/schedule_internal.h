// What the schedules (schedule.cpp, schedule_interleaved.cpp, schedule_zero_bubble.cpp,
// schedule_grid.cpp) and the engine's transfers (pipeline_transfers.cpp) share; not part of the
// public contract.
#pragma once

#include <vector>

#include "dscpp/pipe/schedule.h"

namespace dscpp::pipe {

// Refuses a shape out of range (stages, stage, micro_batches, chunks, a schedule kind that
// does not fit the chunks) with dscpp::Error.
void validate(const PipeShape& shape);
// Megatron's interleaved 1F1B (shape.chunks > 1), or its forward-only order (forward_only:
// for eval_batch); the shape validated by the caller.
std::vector<Step> interleaved_schedule(const PipeShape& shape, bool forward_only);
// ZB-H1 and ZB-V (schedule_zero_bubble.cpp); the shape validated by the caller.
std::vector<Step> zero_bubble_h1_schedule(const PipeShape& shape);
std::vector<Step> zero_bubble_v_schedule(const PipeShape& shape);
// ReduceTiedGrads, ReduceGrads, OptimizerStep: the last step's tail.
void append_step_level(Step& last);
// SendActivation, RecvActivation, SendGrad, RecvGrad.
bool is_transfer(Op op);

// Every stage's compute laid out on common steps: grid[s][t] is what stage s computes in step
// t, in order (Forward, Backward, BackwardInput, BackwardWeight; empty: idle). Virtual stages
// are placed as place_of says. The grid must keep the dependencies: a forward in step t
// takes an input computed by step t - 1 (or earlier in the same step on the same rank), a
// backward (or B) a gradient computed by step t - 1 (the last virtual stage: its own forward,
// earlier), a W follows its B.
struct Work {
  Op op;
  int chunk;
  int micro_batch;
};
using Grid = std::vector<std::vector<std::vector<Work>>>;
// ZB-V's grid (every stage's), whose length also gives its bubble.
Grid zero_bubble_v_grid(const PipeShape& shape);

// Every stage's work in its own order, as groups (order[s][k]: the k-th group of stage s),
// laid out on common steps as early as the dependencies allow: stage s takes its next group in
// step t when all that the group needs was computed by step t - 1, or earlier in the group, and
// is idle in step t otherwise. A forward of virtual stage vs needs the forward of vs - 1; a
// backward (or its B) the backward of vs + 1, the last virtual stage its own forward; a W its
// B. `what` names the schedule in the error of a layout that cannot go on (a bug).
Grid lay_out(const PipeShape& shape, const std::vector<std::vector<std::vector<Work>>>& order,
             const char* what);

// Stage shape.stage's steps from the grid: an activation travels in the step its consumer
// computes it, a gradient in the step after its producer computed it (a step is added at the
// end where the last one computed a gradient to send), both ends listing the transfer in the
// same step, sorted by a key both compute alike (a transfer between two chunks of one stage is
// listed twice there, its send and its receive); the loads before the forwards that need them;
// slots by span (the lowest free one); the step-level tail when training.
std::vector<Step> steps_from_grid(const PipeShape& shape, const Grid& grid, bool training);

}  // namespace dscpp::pipe
