// The pipeline's topology and groups: see parallel_groups.h.
#include "dscpp/pipe/parallel_groups.h"

#include <fmt/format.h>

#include <algorithm>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/error.h"

namespace dscpp::pipe {

comm::Topology pipe_model_data_topology(int pipe, int model, int data) {
  return comm::Topology({"pipe", "data", "model"}, {pipe, data, model});
}

namespace {

bool has_axis(const comm::Topology& topo, const std::string& axis) {
  try {
    (void)topo.get_dim(axis);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::shared_ptr<const ParallelGroups> make_parallel_groups(const GroupPtr& world,
                                                           const comm::Topology& topology,
                                                           int num_chunks) {
  auto g = std::make_shared<ParallelGroups>();
  const int p = topology.get_dim("pipe"), d = topology.get_dim("data");
  const bool model_axis = has_axis(topology, "model");
  const int t = model_axis ? topology.get_dim("model") : 1;
  if (p * d * t != topology.world_size())
    throw Error(fmt::format(
        "PipelineModule: the topology must have axes pipe, data and (optionally) model only "
        "(pipe {} x data {} x model {} = {} ranks, the topology lays out {})",
        p, d, t, p * d * t, topology.world_size()));
  if (topology.world_size() != world->size())
    throw Error(
        fmt::format("PipelineModule: the topology lays out {} ranks (pipe {} x data {} x "
                    "model {}), the world has {}",
                    topology.world_size(), p, d, t, world->size()));
  g->stages = p;
  g->data_size = d;
  g->model_size = t;
  g->num_chunks = num_chunks;
  g->world = world;
  // The topology's rank of each coordinate (its axes may come in any order).
  for (int s = 0; s < p; ++s)
    for (int i = 0; i < d; ++i)
      for (int m = 0; m < t; ++m) {
        std::map<std::string, int> coord{{"pipe", s}, {"data", i}};
        if (model_axis) coord["model"] = m;
        g->ranks.push_back(topology.get_rank(coord));
      }
  const auto coord = topology.get_coord(world->rank());
  g->stage = coord.at("pipe");
  g->data_id = coord.at("data");
  g->model_id = coord.count("model") ? coord.at("model") : 0;
  auto name = [t](const std::string& what, int m) {
    return t > 1 ? fmt::format("{} model {}", what, m) : what;
  };
  // Every rank makes every group in the same order (new_subgroup is collective over the
  // world's ranks in order), keeping the ones it belongs to.
  for (int s = 0; s < p; ++s)
    for (int m = 0; m < t; ++m) {
      std::vector<int> ranks;
      for (int i = 0; i < d; ++i) ranks.push_back(g->rank_of(s, i, m));
      std::sort(ranks.begin(), ranks.end());
      if (auto sub = world->new_subgroup(ranks, name(fmt::format("data(stage {})", s), m)))
        g->data = sub;
    }
  for (int i = 0; i < d; ++i)
    for (int m = 0; m < t; ++m) {
      std::vector<int> ranks;
      for (int s = 0; s < p; ++s) ranks.push_back(g->rank_of(s, i, m));
      // Stage s is group rank s only when the stages' ranks ascend (DeepSpeed's order does).
      if (!std::is_sorted(ranks.begin(), ranks.end()))
        throw Error(
            "PipelineModule: the topology must put the pipe axis before data and model "
            "(DeepSpeed's order), so that stage s is rank s of its pipe group");
      if (auto sub = world->new_subgroup(ranks, name(fmt::format("pipe(data {})", i), m)))
        g->pipe = sub;
    }
  if (t > 1) {
    for (int s = 0; s < p; ++s)
      for (int i = 0; i < d; ++i) {
        std::vector<int> ranks;
        for (int m = 0; m < t; ++m) ranks.push_back(g->rank_of(s, i, m));
        std::sort(ranks.begin(), ranks.end());
        if (auto sub = world->new_subgroup(ranks, fmt::format("model(stage {}, data {})", s, i)))
          g->model = sub;
      }
  }
  std::set<std::pair<int, int>> pairs;
  for (int s = 0; s + 1 < p; ++s) pairs.insert({s, s + 1});
  if (num_chunks > 1 && p > 2) pairs.insert({0, p - 1});
  for (int i = 0; i < d; ++i)
    for (int m = 0; m < t; ++m)
      for (const auto& [a, b] : pairs) {
        std::vector<int> ranks{g->rank_of(a, i, m), g->rank_of(b, i, m)};
        std::sort(ranks.begin(), ranks.end());
        auto sub =
            world->new_subgroup(ranks, name(fmt::format("pipe link {}-{} (data {})", a, b, i), m));
        if (sub) g->links[g->stage == a ? b : a] = sub;
      }
  return g;
}

}  // namespace dscpp::pipe
