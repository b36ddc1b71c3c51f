// train_gpt's process groups (job_groups.h).
#include "job_groups.h"

#include <vector>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/comm/topology.h"

namespace dscpp::examples {

JobGroups job_groups(int64_t tensor, int64_t sequence) {
  auto world = comm::init_distributed();
  const int t = static_cast<int>(tensor), p = static_cast<int>(sequence);
  comm::Topology topo({"pipe", "data", "sequence", "model"}, {1, world->size() / (t * p), p, t});
  JobGroups g;
  if (t > 1) {
    for (const auto& ranks : topo.get_axis_comm_lists("model"))
      if (auto sub = world->new_subgroup(ranks, "model")) g.model = sub;
    for (int m = 0; m < t; ++m) {
      std::vector<int> ranks;
      for (int r = m; r < world->size(); r += t) ranks.push_back(r);
      if (auto sub = world->new_subgroup(ranks, "data")) g.data = sub;
    }
  }
  if (p > 1)
    for (const auto& ranks : topo.get_axis_comm_lists("sequence"))
      if (auto sub = world->new_subgroup(ranks, "sequence")) g.sequence = sub;
  return g;
}

}  // namespace dscpp::examples
