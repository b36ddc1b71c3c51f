// train_gpt's process groups for the layouts without a pipeline.
#pragma once

#include <cstdint>
#include <memory>

#include "dscpp/comm/process_group.h"

namespace dscpp::examples {

// The job's groups in the layout pipe 1 x data x sequence x model (DeepSpeed's order, the model
// axis fastest: a tensor-parallel group is consecutive ranks; DeepSpeed-Ulysses' groups next,
// inside the data axis, where Megatron places its context-parallel groups): the model group,
// the sequence group, and the engine's group, every rank of this model rank (the data and
// sequence ranks: ZeRO partitions and reduces over it). Null where the degree is 1 (the
// engine's: the world). Collective: every rank makes every group, in one order.
struct JobGroups {
  std::shared_ptr<comm::ProcessGroup> data, model, sequence;
};
JobGroups job_groups(int64_t tensor, int64_t sequence);

}  // namespace dscpp::examples
