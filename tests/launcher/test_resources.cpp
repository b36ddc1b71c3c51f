#include <gtest/gtest.h>

#include "resources.h"

namespace dscpp::launcher {
namespace {

// The cases of DeepSpeed's tests/unit/launcher/test_run.py, so a filter string means the
// same to dscpp as to deepspeed.
const ActiveResources kOneNode = {{"worker-0", {0, 1, 2, 3}}};
const ActiveResources kTwoNodes = {{"worker-0", {0, 1, 2, 3}}, {"worker-1", {0, 1, 2, 3}}};

TEST(ResourceFilter, IncludeAndExcludeAreMutuallyExclusive) {
  EXPECT_THROW(parse_resource_filter({}, "A", "B"), ResourceError);
}

TEST(ResourceFilter, LocalNode) {
  EXPECT_EQ(parse_resource_filter(kOneNode, "", ""), kOneNode);
  EXPECT_EQ(parse_resource_filter(kOneNode, "", "worker-0:1"),
            (ActiveResources{{"worker-0", {0, 2, 3}}}));
  EXPECT_EQ(parse_resource_filter(kOneNode, "", "worker-0:1,2"),
            (ActiveResources{{"worker-0", {0, 3}}}));
  EXPECT_EQ(parse_resource_filter(kOneNode, "worker-0:1", ""),
            (ActiveResources{{"worker-0", {1}}}));
  // Naming a slot twice, or a host twice, is harmless.
  EXPECT_EQ(parse_resource_filter(kOneNode, "worker-0:1,1", ""),
            (ActiveResources{{"worker-0", {1}}}));
  EXPECT_EQ(parse_resource_filter(kOneNode, "worker-0:1@worker-0:0,1", ""),
            (ActiveResources{{"worker-0", {0, 1}}}));
  // A bare host name means all of its slots.
  EXPECT_EQ(parse_resource_filter(kOneNode, "worker-0", ""), kOneNode);
  EXPECT_EQ(parse_resource_filter(kOneNode, "", "worker-0"), ActiveResources{});
  EXPECT_EQ(parse_resource_filter(kOneNode, "", "worker-0:0,1,2,3"), ActiveResources{});
}

TEST(ResourceFilter, MultiNode) {
  EXPECT_EQ(parse_resource_filter(kTwoNodes, "", ""), kTwoNodes);
  EXPECT_EQ(parse_resource_filter(kTwoNodes, "worker-1:0,3", ""),
            (ActiveResources{{"worker-1", {0, 3}}}));
  EXPECT_EQ(parse_resource_filter(kTwoNodes, "", "worker-1"),
            (ActiveResources{{"worker-0", {0, 1, 2, 3}}}));
  EXPECT_EQ(parse_resource_filter(kTwoNodes, "", "worker-0:0,1@worker-1:3"),
            (ActiveResources{{"worker-0", {2, 3}}, {"worker-1", {0, 1, 2}}}));
}

TEST(ResourceFilter, ResultKeepsHostfileOrderAndSortsSlots) {
  EXPECT_EQ(parse_resource_filter(kTwoNodes, "worker-1:3,1@worker-0:2", ""),
            (ActiveResources{{"worker-0", {2}}, {"worker-1", {1, 3}}}));
}

TEST(ResourceFilter, Errors) {
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "jeff", ""), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "", "jeff"), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "worker-1:4", ""), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "", "worker-1:4"), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "", "worker-1@worker-0:1@5"), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "worker-0:", ""), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "worker-0:a", ""), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "worker-0:1:2", ""), ResourceError);
  EXPECT_THROW(parse_resource_filter(kTwoNodes, "worker-0@", ""), ResourceError);
}

TEST(ResourceFilter, ErrorMessagesMatchDeepSpeed) {
  try {
    parse_resource_filter(kTwoNodes, "jeff", "");
    FAIL();
  } catch (const ResourceError& e) {
    EXPECT_STREQ(e.what(), "Hostname 'jeff' not found in hostfile");
  }
  try {
    parse_inclusion_exclusion({{"localhost", 2}}, "localhost:0,2", "");
    FAIL();
  } catch (const ResourceError& e) {
    EXPECT_STREQ(e.what(), "No slot '2' specified on host 'localhost'");
  }
}

TEST(InclusionExclusion, MapsSlotCountsOntoSlotIds) {
  const ResourcePool pool = {{"worker-0", 4}, {"worker-1", 4}};
  EXPECT_EQ(parse_inclusion_exclusion(pool, "", ""), kTwoNodes);
  EXPECT_EQ(parse_inclusion_exclusion(pool, "worker-0", ""),
            (ActiveResources{{"worker-0", {0, 1, 2, 3}}}));
  EXPECT_EQ(parse_inclusion_exclusion(pool, "worker-0@worker-1:0,2", ""),
            (ActiveResources{{"worker-0", {0, 1, 2, 3}}, {"worker-1", {0, 2}}}));
  EXPECT_EQ(parse_inclusion_exclusion(pool, "worker-1:0,2", ""),
            (ActiveResources{{"worker-1", {0, 2}}}));
  EXPECT_EQ(parse_inclusion_exclusion(pool, "", "worker-0:1"),
            (ActiveResources{{"worker-0", {0, 2, 3}}, {"worker-1", {0, 1, 2, 3}}}));
}

TEST(InclusionExclusion, OutOfRangeSlotsAreRejectedBothWays) {
  const ResourcePool pool = {{"worker-0", 4}};
  for (const char* spec : {"worker-0:4", "worker-0:99", "worker-0:0,4"}) {
    EXPECT_THROW(parse_inclusion_exclusion(pool, spec, ""), ResourceError) << spec;
    EXPECT_THROW(parse_inclusion_exclusion(pool, "", spec), ResourceError) << spec;
  }
  EXPECT_THROW(parse_inclusion_exclusion(pool, "jeff", ""), ResourceError);
}

TEST(NumNodesAndGpus, TrimsHostsAndSetsSlots) {
  EXPECT_EQ(apply_num_nodes_and_gpus(kTwoNodes, 1, -1),
            (ActiveResources{{"worker-0", {0, 1, 2, 3}}}));
  EXPECT_EQ(apply_num_nodes_and_gpus(kTwoNodes, -1, 2),
            (ActiveResources{{"worker-0", {0, 1}}, {"worker-1", {0, 1}}}));
  EXPECT_EQ(apply_num_nodes_and_gpus(kTwoNodes, 5, 6).size(), 2u);
  EXPECT_EQ(apply_num_nodes_and_gpus(kTwoNodes, 5, 6)[0].second,
            (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(RangeList, ParsesDeepSpeedCoreLists) {
  EXPECT_EQ(parse_range_list("0,2-4,6"), (std::vector<int>{0, 2, 3, 4, 6}));
  EXPECT_EQ(parse_range_list("1,3-5,7"), (std::vector<int>{1, 3, 4, 5, 7}));
  EXPECT_EQ(parse_range_list("5"), (std::vector<int>{5}));
  EXPECT_THROW(parse_range_list("3,1"), ResourceError);
  EXPECT_THROW(parse_range_list("0-3,2"), ResourceError);
  EXPECT_THROW(parse_range_list("4-2"), ResourceError);
  EXPECT_THROW(parse_range_list("1-2-3"), ResourceError);
  EXPECT_THROW(parse_range_list("a"), ResourceError);
  EXPECT_THROW(parse_range_list(""), ResourceError);
}

}  // namespace
}  // namespace dscpp::launcher
