// The pipeline's 3D topology and its process groups: DeepSpeed's PipeModelDataParallelTopology
// (axes pipe, data, model; model fastest, so a tensor-parallel group is consecutive ranks on
// one node) and the groups PipelineParallelGrid makes on it:
//   - data:  same stage and model rank (ZeRO partitions and reduces over it only),
//   - pipe:  same data and model rank, stage s its group rank s (the loss travels on it),
//   - model: same stage and data rank (tensor parallelism's all-reduces),
//   - links: the two-rank group of this rank and a neighbour stage (same data and model rank),
//     on which activations and their gradients travel; with chunks on more than 2 stages the
//     last stage's link back to the first too.
// Made collectively, every rank in the same order, before the layers are built, since a
// tensor-parallel layer needs its model group (Megatron-DeepSpeed initialises its mpu first
// too). A pipe x data topology (no model axis) is model size 1, as before.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/comm/topology.h"

namespace dscpp::pipe {

using GroupPtr = std::shared_ptr<comm::ProcessGroup>;

// DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp, num_dp): axes pipe, data, model.
comm::Topology pipe_model_data_topology(int pipe, int model, int data);

struct ParallelGroups {
  int stages = 1, data_size = 1, model_size = 1;
  int stage = 0, data_id = 0, model_id = 0;  // this rank's coordinates
  int num_chunks = 1;                        // the chunks the links were made for
  GroupPtr world, data, pipe, model;
  std::map<int, GroupPtr> links;  // by the peer's stage
  // The world rank at (stage, data, model).
  int rank_of(int stage, int data, int model) const {
    return ranks.at(static_cast<size_t>((stage * data_size + data) * model_size + model));
  }
  std::vector<int> ranks;  // the topology's rank of each (stage, data, model), row-major
};

// The groups of `topology` (axes "pipe" and "data", optionally "model", any order; their
// product the world's size) on `world`. Throws dscpp::Error naming a bad axis or a size that
// does not match the world.
std::shared_ptr<const ParallelGroups> make_parallel_groups(const GroupPtr& world,
                                                           const comm::Topology& topology,
                                                           int num_chunks = 1);

}  // namespace dscpp::pipe
