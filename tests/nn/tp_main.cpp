// The tensor-parallel tests' main: joins the Gloo job the dscpp launcher started and forms
// the model groups (the world, and the groups of every smaller degree that divides it, as
// Topology {data, model} lays them), then runs every test on each group.
#include <gtest/gtest.h>

#include <iostream>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/comm/topology.h"
#include "tp_test_util.h"

namespace tp_test {

namespace {
dscpp::nn::GroupPtr world_group;
std::vector<ModelGroup> groups;
}  // namespace

const std::vector<ModelGroup>& model_groups() {
  return groups;
}
const dscpp::nn::GroupPtr& world() {
  return world_group;
}

}  // namespace tp_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(60);
  auto world = dscpp::comm::init_distributed(options);
  tp_test::world_group = world;
  const int n = world->size();
  tp_test::groups.push_back({"t" + std::to_string(n) + " (world)", world});
  // Every smaller tensor-parallel degree t > 1 that divides the world, as Topology
  // {data, model} lays it (the model axis fastest: groups of consecutive ranks).
  for (int t = n / 2; t > 1; --t) {
    if (n % t != 0) continue;
    dscpp::comm::Topology topo({"data", "model"}, {n / t, t});
    for (const auto& ranks : topo.get_axis_comm_lists("model")) {
      auto g = world->new_subgroup(ranks,
                                   "model_t" + std::to_string(t) + "_" + std::to_string(ranks[0]));
      if (g)
        tp_test::groups.push_back(
            {"t" + std::to_string(t) + " from rank " + std::to_string(ranks[0]), g});
    }
  }
  std::cout << "tp tests: rank " << world->rank() << " of " << n << ", " << tp_test::groups.size()
            << " model groups\n";
  const int rc = RUN_ALL_TESTS();
  world->barrier().wait();
  tp_test::groups.clear();
  tp_test::world_group.reset();
  return rc;
}
