#include <gtest/gtest.h>

#include "node_plan.h"

namespace dscpp::launcher {
namespace {

NodeConfig two_nodes(int node_rank) {
  NodeConfig c;
  c.world = {{"worker-0", {0, 1}}, {"worker-1", {2, 5, 7}}};
  c.node_rank = node_rank;
  c.master_addr = "10.0.0.1";
  c.master_port = 1234;
  c.program = "./train";
  c.program_args = {"--deepspeed_config", "ds.json"};
  return c;
}

TEST(NodePlan, RankEnvironmentOnTheSecondNode) {
  const auto ranks = plan_node(two_nodes(1));
  ASSERT_EQ(ranks.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const RankLaunch& r = ranks[i];
    EXPECT_EQ(r.rank, 2 + i);
    EXPECT_EQ(r.local_rank, i);
    const EnvList expected = {{"RANK", std::to_string(2 + i)},
                              {"LOCAL_RANK", std::to_string(i)},
                              {"WORLD_SIZE", "5"},
                              {"LOCAL_SIZE", "3"},
                              {"CROSS_RANK", "1"},
                              {"CROSS_SIZE", "2"},
                              {"MASTER_ADDR", "10.0.0.1"},
                              {"MASTER_PORT", "1234"},
                              {"CUDA_VISIBLE_DEVICES", "2,5,7"}};
    EXPECT_EQ(r.env, expected);
    EXPECT_EQ(r.argv, (std::vector<std::string>{"./train", "--local_rank=" + std::to_string(i),
                                                "--deepspeed_config", "ds.json"}));
    EXPECT_TRUE(r.cpus.empty());
  }
}

TEST(NodePlan, HiddenGpusLeaveTheRanksAnEmptyDeviceList) {
  NodeConfig c = two_nodes(0);
  c.hide_gpus = true;
  for (const RankLaunch& r : plan_node(c)) EXPECT_EQ(get_env(r.env, "CUDA_VISIBLE_DEVICES"), "");
}

TEST(NodePlan, NoLocalRankAndExtraEnvironment) {
  NodeConfig c = two_nodes(0);
  c.no_local_rank = true;
  c.extra_env = {{"FOO", "bar"}, {"RANK", "overridden"}};
  const auto ranks = plan_node(c);
  EXPECT_EQ(ranks[1].argv, (std::vector<std::string>{"./train", "--deepspeed_config", "ds.json"}));
  EXPECT_EQ(ranks[1].env.front(), (std::pair<std::string, std::string>{"FOO", "bar"}));
  EXPECT_EQ(get_env(ranks[1].env, "RANK"), "1");
}

TEST(NodePlan, CoreBindingSplitsEvenly) {
  NodeConfig c = two_nodes(1);
  c.bind_cores_to_rank = true;
  c.default_cores = {0, 1, 2, 3, 4, 5, 6};
  const auto ranks = plan_node(c);
  EXPECT_EQ(ranks[0].cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(ranks[2].cpus, (std::vector<int>{4, 5}));
  EXPECT_EQ(get_env(ranks[2].env, "OMP_NUM_THREADS"), "2");
  c.bind_core_list = "8,10-12";
  EXPECT_EQ(plan_node(c)[1].cpus, (std::vector<int>{10}));
  c.bind_core_list = "8,9";
  EXPECT_THROW(plan_node(c), UserError);
}

TEST(NodePlan, NodeRankOutOfRange) {
  EXPECT_THROW(plan_node(two_nodes(2)), UserError);
  EXPECT_THROW(plan_node(two_nodes(-1)), UserError);
}

}  // namespace
TEST(NodePlan, LocalRankGoesAfterAPythonScriptAsInDeepSpeed) {
  NodeConfig c = two_nodes(0);
  c.program = "/usr/bin/python3";
  c.program_args = {"train.py", "--deepspeed_config", "ds.json"};
  auto ranks = plan_node(c);
  EXPECT_EQ(ranks[0].argv,
            (std::vector<std::string>{"/usr/bin/python3", "train.py", "--local_rank=0",
                                      "--deepspeed_config", "ds.json"}));
}

}  // namespace dscpp::launcher
