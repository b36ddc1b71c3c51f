// The expert-parallel and expert-data-parallel groups: cuts of the data-parallel groups.
#include "dscpp/comm/expert_groups.h"

#include <fmt/format.h>

#include <string>

namespace dscpp::comm {

ExpertGroupLists expert_parallel_comm_lists(const Topology& topo, int ep_size) {
  const int data = topo.get_dim("data");
  if (ep_size < 1 || data % ep_size != 0)
    throw CommError(fmt::format(
        "expert parallelism: ep_size {} must divide the data-parallel size {} (the expert axis "
        "splits the data axis)",
        ep_size, data));
  ExpertGroupLists lists;
  for (const auto& data_ranks : topo.get_axis_comm_lists("data")) {
    const int runs = data / ep_size;
    for (int g = 0; g < runs; ++g)
      lists.expert_parallel.emplace_back(data_ranks.begin() + g * ep_size,
                                         data_ranks.begin() + (g + 1) * ep_size);
    for (int pos = 0; pos < ep_size; ++pos) {
      std::vector<int> edp;
      for (int g = 0; g < runs; ++g) edp.push_back(data_ranks[g * ep_size + pos]);
      lists.expert_data_parallel.push_back(edp);
    }
  }
  return lists;
}

ExpertGroups new_expert_groups(ProcessGroup& world, const Topology& topo, int ep_size) {
  if (topo.world_size() != world.size())
    throw CommError(fmt::format("expert parallelism: the topology has {} ranks, group '{}' {}",
                                topo.world_size(), world.name(), world.size()));
  ExpertGroupLists lists = expert_parallel_comm_lists(topo, ep_size);
  ExpertGroups mine;
  auto make = [&](const std::vector<std::vector<int>>& all, const char* kind,
                  std::shared_ptr<ProcessGroup>& out) {
    for (const auto& ranks : all) {
      auto g = world.new_subgroup(
          ranks, fmt::format("{}_ep{}_{}", kind, ep_size, fmt::to_string(ranks.front())));
      if (g) out = g;
    }
  };
  make(lists.expert_parallel, "expert_parallel", mine.expert_parallel);
  make(lists.expert_data_parallel, "expert_data_parallel", mine.expert_data_parallel);
  return mine;
}

}  // namespace dscpp::comm
