// DeepSpeed's expert groups for ep_size (deepspeed/utils/groups.py, _get_expert_parallel_ranks,
// which its legacy path without tensor parallelism agrees with): the expert axis splits the
// data axis. Each data-parallel group (ranks differing only on "data", in data order) is cut
// into consecutive runs of ep_size ranks, the expert-parallel groups (the dispatch all-to-all);
// the ranks at the same place of those runs form the expert-data-parallel groups (expert
// gradients' reduction). Example, world 16, model 2, ep 4: data [0,2,..,14] gives expert
// groups [0,2,4,6] [8,10,12,14] and expert-data groups [0,8] [2,10] [4,12] [6,14].
// ep_size must divide the data axis (a CommError naming both otherwise).
#pragma once

#include <memory>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/comm/topology.h"

namespace dscpp::comm {

struct ExpertGroupLists {
  std::vector<std::vector<int>> expert_parallel;       // every group, ascending ranks
  std::vector<std::vector<int>> expert_data_parallel;  // every group, ascending ranks
};

// Pure arithmetic on a topology with a "data" axis (other axes: any).
ExpertGroupLists expert_parallel_comm_lists(const Topology& topo, int ep_size);

// This rank's two groups, made from `world` (every rank must call it, in the same order).
struct ExpertGroups {
  std::shared_ptr<ProcessGroup> expert_parallel;
  std::shared_ptr<ProcessGroup> expert_data_parallel;
};
ExpertGroups new_expert_groups(ProcessGroup& world, const Topology& topo, int ep_size);

}  // namespace dscpp::comm
