// Topology lays ranks as DeepSpeed's ProcessTopology does (last axis fastest).
#include <gtest/gtest.h>

#include "dscpp/comm/topology.h"
#include "dscpp/error.h"

using dscpp::comm::Topology;

TEST(Topology, RanksAreRowMajorOverTheAxes) {
  Topology t({"pipe", "data"}, {2, 2});
  EXPECT_EQ(t.world_size(), 4);
  EXPECT_EQ(t.get_rank({{"pipe", 0}, {"data", 0}}), 0);
  EXPECT_EQ(t.get_rank({{"pipe", 0}, {"data", 1}}), 1);
  EXPECT_EQ(t.get_rank({{"pipe", 1}, {"data", 0}}), 2);
  EXPECT_EQ(t.get_coord(3), (std::map<std::string, int>{{"pipe", 1}, {"data", 1}}));
}

TEST(Topology, AxisListsMatchDeepSpeed) {
  // DeepSpeed's PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2): axes pipe, data,
  // model.
  Topology t({"pipe", "data", "model"}, {2, 2, 2});
  EXPECT_EQ(t.get_axis_comm_lists("model"),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(t.get_axis_comm_lists("data"),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(t.get_axis_comm_lists("pipe"),
            (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(Topology, BadInputIsAnError) {
  EXPECT_THROW(Topology({"a"}, {0}), dscpp::Error);
  EXPECT_THROW(Topology({"a", "b"}, {2}), dscpp::Error);
  Topology t({"data"}, {4});
  EXPECT_THROW(t.get_axis_comm_lists("pipe"), dscpp::Error);
  EXPECT_THROW(t.get_coord(4), dscpp::Error);
}
