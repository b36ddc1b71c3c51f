#include <gtest/gtest.h>

#include "launch_plan.h"

namespace dscpp::launcher {
namespace {

Options opts(std::vector<std::string> args) {
  args.push_back("prog");
  return parse_options(args);
}

LocalMachine gpus(int n, std::optional<std::string> visible = std::nullopt) {
  return LocalMachine{n, 16, std::move(visible)};
}

const ResourcePool kTwoHosts = {{"worker-0", 4}, {"worker-1", 4}};

TEST(LaunchPlan, SingleNodeUsesAllLocalGpus) {
  const LaunchPlan plan = resolve_launch(opts({}), std::nullopt, gpus(4));
  EXPECT_EQ(plan.active, (ActiveResources{{"localhost", {0, 1, 2, 3}}}));
  EXPECT_FALSE(plan.multi_node);
  EXPECT_EQ(plan.node_rank, 0);
  EXPECT_EQ(plan.master_addr, "127.0.0.1");
  EXPECT_TRUE(plan.notices.empty());
}

TEST(LaunchPlan, NumGpusSelectsTheFirstDevices) {
  EXPECT_EQ(resolve_launch(opts({"--num_gpus", "2"}), std::nullopt, gpus(8)).active,
            (ActiveResources{{"localhost", {0, 1}}}));
}

TEST(LaunchPlan, WithoutGpusStartsCpuRanks) {
  const LaunchPlan three = resolve_launch(opts({"--num_gpus", "3"}), std::nullopt, gpus(0));
  EXPECT_EQ(three.active, (ActiveResources{{"localhost", {0, 1, 2}}}));
  EXPECT_EQ(three.notices, std::vector<std::string>{"no GPU found, starting 3 CPU ranks"});
  const LaunchPlan one = resolve_launch(opts({}), std::nullopt, gpus(0));
  EXPECT_EQ(one.active, (ActiveResources{{"localhost", {0}}}));
}

// --num_gpus 10000 on a CPU machine started 10,000 processes.
TEST(LaunchPlan, CpuRanksFarBeyondTheMachineAreRefused) {
  const LocalMachine two_cores{0, 2, std::nullopt};
  // The tests' 8 ranks on 2 cores, and up to 64 a core, stay allowed.
  EXPECT_EQ(
      resolve_launch(opts({"--num_gpus", "8"}), std::nullopt, two_cores).active[0].second.size(),
      8u);
  EXPECT_EQ(
      resolve_launch(opts({"--num_gpus", "128"}), std::nullopt, two_cores).active[0].second.size(),
      128u);
  for (const char* n : {"129", "10000"}) {
    try {
      resolve_launch(opts({"--num_gpus", n}), std::nullopt, two_cores);
      ADD_FAILURE() << n << " CPU ranks on 2 cores accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    std::string(n) + " CPU ranks on a machine with 2 core(s) is more than 128 (64 "
                                     "per core); pass --oversubscribe"),
                std::string::npos)
          << e.what();
    }
  }
  // A device mask names slots too: CUDA_VISIBLE_DEVICES=9999 would be 10,000 ranks.
  EXPECT_THROW(resolve_launch(opts({}), std::nullopt, LocalMachine{0, 2, "9999"}), UserError);
  EXPECT_EQ(
      resolve_launch(opts({"--num_gpus", "10000", "--oversubscribe"}), std::nullopt, two_cores)
          .active[0]
          .second.size(),
      10000u);
}

// A GPU build's rank takes the device of its LOCAL_RANK: more ranks than GPUs would die in
// NCCL after the others had started, so the plan is refused before anything starts.
TEST(LaunchPlan, MoreRanksThanGpusAreRefusedNamingBothCounts) {
  for (const auto& visible : {std::optional<std::string>(), std::optional<std::string>("0")}) {
    try {
      resolve_launch(opts({"--num_gpus", "2"}), std::nullopt, gpus(1, visible));
      ADD_FAILURE() << "2 ranks on 1 GPU accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--num_gpus 2: this machine has 1 GPU, and each rank "
                                           "needs one of its own. Ask for at most 1 (--num_gpus "
                                           "1), or start 2 CPU ranks over Gloo with "
                                           "DS_ACCELERATOR=cpu"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(resolve_launch(opts({"--num_gpus", "8"}), std::nullopt, gpus(4)), UserError);
  // As many ranks as GPUs, or fewer, start as before.
  EXPECT_EQ(resolve_launch(opts({"--num_gpus", "4"}), std::nullopt, gpus(4)).active,
            (ActiveResources{{"localhost", {0, 1, 2, 3}}}));
}

TEST(LaunchPlan, CpuAcceleratorStartsCpuRanksWithTheGpusHidden) {
  LocalMachine machine = gpus(1);
  machine.cpu_accelerator = true;
  const LaunchPlan plan = resolve_launch(opts({"--num_gpus", "4"}), std::nullopt, machine);
  EXPECT_EQ(plan.active, (ActiveResources{{"localhost", {0, 1, 2, 3}}}));
  EXPECT_TRUE(plan.hide_gpus);
  EXPECT_EQ(plan.notices.back(),
            "DS_ACCELERATOR=cpu: starting 4 CPU ranks, the GPUs hidden from them");
  // Without GPUs there is nothing to hide.
  LocalMachine cpu_only = gpus(0);
  cpu_only.cpu_accelerator = true;
  EXPECT_FALSE(resolve_launch(opts({"--num_gpus", "2"}), std::nullopt, cpu_only).hide_gpus);
  EXPECT_FALSE(resolve_launch(opts({"--num_gpus", "1"}), std::nullopt, gpus(1)).hide_gpus);
}

// DeepSpeed's test_visible_devices_resolve_to_the_requested_slots.
TEST(LaunchPlan, CudaVisibleDevicesBecomesAnInclude) {
  const LaunchPlan plan = resolve_launch(opts({}), std::nullopt, gpus(4, "0,2"));
  EXPECT_EQ(plan.active, (ActiveResources{{"localhost", {0, 2}}}));
  ASSERT_FALSE(plan.notices.empty());
  EXPECT_NE(plan.notices[0].find("setting --include=localhost:0,2"), std::string::npos);
}

TEST(LaunchPlan, CudaVisibleDevicesOnACpuMachine) {
  const LaunchPlan plan = resolve_launch(opts({}), std::nullopt, gpus(0, "1,3"));
  EXPECT_EQ(plan.active, (ActiveResources{{"localhost", {1, 3}}}));
  EXPECT_EQ(plan.notices.back(), "no GPU found, starting 2 CPU ranks");
}

TEST(LaunchPlan, CudaVisibleDevicesIgnoredWithExplicitSelection) {
  const LaunchPlan plan = resolve_launch(opts({"--num_gpus", "1"}), std::nullopt, gpus(4, "2,3"));
  EXPECT_EQ(plan.active, (ActiveResources{{"localhost", {0}}}));
  EXPECT_NE(plan.notices[0].find("ignoring it"), std::string::npos);
  // --num_nodes 1 alone does not turn the mask into a conflict.
  EXPECT_EQ(resolve_launch(opts({"--num_nodes", "1"}), std::nullopt, gpus(4, "2,3")).active,
            (ActiveResources{{"localhost", {2, 3}}}));
}

TEST(LaunchPlan, CudaVisibleDevicesErrors) {
  // A mask naming a device that does not exist (DeepSpeed's masked-count test).
  EXPECT_THROW(resolve_launch(opts({}), std::nullopt, gpus(2, "0,2")), UserError);
  EXPECT_THROW(resolve_launch(opts({}), std::nullopt, gpus(2, "GPU-1234")), UserError);
  // An empty mask is ignored, as DeepSpeed does.
  EXPECT_EQ(resolve_launch(opts({}), std::nullopt, gpus(2, "")).active.front().second.size(), 2u);
}

// DeepSpeed's test_num_plus_parser.
TEST(LaunchPlan, NumNodesOrGpusWithIncludeOrExclude) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--num_nodes", "1", "-i", "localhost"},
           {"--num_nodes", "1", "--num_gpus", "1", "-i", "localhost"},
           {"--num_gpus", "1", "-i", "localhost"},
           {"--num_nodes", "1", "-e", "localhost"},
           {"--num_nodes", "1", "--num_gpus", "1", "-e", "localhost"},
           {"--num_gpus", "1", "-e", "localhost"}}) {
    EXPECT_THROW(resolve_launch(opts(args), std::nullopt, gpus(2)), UserError);
  }
}

TEST(LaunchPlan, NumNodesBeyondOneNeedsAHostfile) {
  EXPECT_THROW(resolve_launch(opts({"--num_nodes", "2"}), std::nullopt, gpus(2)), UserError);
}

TEST(LaunchPlan, HostfileWithSeveralHostsIsMultiNode) {
  const LaunchPlan plan = resolve_launch(opts({}), kTwoHosts, gpus(0));
  EXPECT_TRUE(plan.multi_node);
  EXPECT_EQ(plan.active.size(), 2u);
  EXPECT_TRUE(plan.master_addr.empty());  // detected over ssh later
}

TEST(LaunchPlan, FilterDownToOneHostRunsLocally) {
  const LaunchPlan plan = resolve_launch(opts({"-i", "worker-1:1"}), kTwoHosts, gpus(0));
  EXPECT_FALSE(plan.multi_node);
  EXPECT_EQ(plan.active, (ActiveResources{{"worker-1", {1}}}));
  EXPECT_TRUE(
      resolve_launch(opts({"-i", "worker-1:1", "--force_multi"}), kTwoHosts, gpus(0)).multi_node);
}

TEST(LaunchPlan, IncludeNamingAnUnknownHostFails) {
  EXPECT_THROW(resolve_launch(opts({"-i", "worker-9"}), kTwoHosts, gpus(0)), UserError);
  EXPECT_THROW(resolve_launch(opts({"-e", "worker-0:7"}), kTwoHosts, gpus(0)), UserError);
  EXPECT_THROW(resolve_launch(opts({"-i", "worker-0", "-e", "worker-1"}), kTwoHosts, gpus(0)),
               UserError);
}

TEST(LaunchPlan, NoSshRunsOneNodeOfTheHostfile) {
  const LaunchPlan plan =
      resolve_launch(opts({"--no_ssh", "--node_rank", "1"}), kTwoHosts, gpus(0));
  EXPECT_FALSE(plan.multi_node);
  EXPECT_EQ(plan.node_rank, 1);
  EXPECT_EQ(plan.master_addr, "worker-0");
  EXPECT_THROW(resolve_launch(opts({"--no_ssh"}), kTwoHosts, gpus(0)), UserError);
  EXPECT_THROW(resolve_launch(opts({"--no_ssh", "--node_rank", "2"}), kTwoHosts, gpus(0)),
               UserError);
  EXPECT_EQ(resolve_launch(opts({"--no_ssh", "--node_rank", "0", "--master_addr", "10.1.1.1"}),
                           kTwoHosts, gpus(0))
                .master_addr,
            "10.1.1.1");
}

// A port chosen free on this machine cannot be given to, nor checked on, another host.
TEST(LaunchPlan, MasterPortZeroOnlyOnOneNode) {
  auto refusal = [](const std::vector<std::string>& args, const ResourcePool& pool) {
    try {
      resolve_launch(opts(args), pool, gpus(0));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refusal({"--master_port", "0"}, kTwoHosts),
            "--master_port 0 (a free port chosen at launch) works on one node only, and this job "
            "runs on 2 hosts: give a fixed --master_port");
  EXPECT_NE(refusal({"--master_port", "0", "--no_ssh", "--node_rank", "0"}, kTwoHosts)
                .find("runs on 2 hosts"),
            std::string::npos);
  EXPECT_NE(refusal({"--master_port", "0", "-i", "worker-1", "--force_multi"}, kTwoHosts)
                .find("goes through the multi-node backend (--force_multi)"),
            std::string::npos);
  EXPECT_EQ(refusal({"--master_port", "0", "-i", "worker-1"}, kTwoHosts), "accepted");
  EXPECT_FALSE(resolve_launch(opts({"--master_port", "0"}), std::nullopt, gpus(2)).multi_node);
}

TEST(LaunchPlan, SlurmRejectsSlotSelectionEvenWhenItEndsUpLocal) {
  EXPECT_THROW(
      resolve_launch(opts({"--launcher", "slurm", "-i", "worker-0:1"}), kTwoHosts, gpus(0)),
      UserError);
  EXPECT_NO_THROW(
      resolve_launch(opts({"--launcher", "slurm", "-i", "worker-0"}), kTwoHosts, gpus(0)));
}

TEST(LaunchPlan, UnknownLauncher) {
  EXPECT_THROW(resolve_launch(opts({"--launcher", "mvapich"}), kTwoHosts, gpus(0)), UserError);
}

TEST(LaunchPlan, EverythingExcluded) {
  EXPECT_THROW(resolve_launch(opts({"-e", "worker-0@worker-1"}), kTwoHosts, gpus(0)), UserError);
}

}  // namespace
}  // namespace dscpp::launcher
