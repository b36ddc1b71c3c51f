// What schedule.cpp, schedule_interleaved.cpp and the engine's transfers (pipeline_transfers.cpp)
// share; not part of the public contract.
#pragma once

#include "dscpp/pipe/schedule.h"

namespace dscpp::pipe {

// Refuses a shape out of range (stages, stage, micro_batches, chunks) with dscpp::Error.
void validate(const PipeShape& shape);
// Megatron's interleaved 1F1B (shape.chunks > 1), or its forward-only order (forward_only:
// for eval_batch); the shape validated by the caller.
std::vector<Step> interleaved_schedule(const PipeShape& shape, bool forward_only);
// ReduceTiedGrads, ReduceGrads, OptimizerStep: the last step's tail.
void append_step_level(Step& last);
// SendActivation, RecvActivation, SendGrad, RecvGrad.
bool is_transfer(Op op);

}  // namespace dscpp::pipe
