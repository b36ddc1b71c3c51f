#include <gtest/gtest.h>

#include "options.h"

namespace dscpp::launcher {
namespace {

Options parse(std::vector<std::string> args) {
  return parse_options(args);
}

TEST(Options, Defaults) {
  const Options o = parse({"./train"});
  EXPECT_EQ(o.hostfile, "/job/hostfile");
  EXPECT_FALSE(o.hostfile_given);
  EXPECT_EQ(o.num_nodes, -1);
  EXPECT_EQ(o.num_gpus, -1);
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.node_rank, -1);
  EXPECT_EQ(o.launcher, "pdsh");
  EXPECT_FALSE(o.save_pid);
  EXPECT_TRUE(o.each_rank_log.empty());
  EXPECT_EQ(o.program, "./train");
  EXPECT_TRUE(o.program_args.empty());
}

TEST(Options, EverythingAfterTheProgramBelongsToIt) {
  const Options o = parse({"--num_gpus", "8", "./train", "--deepspeed_config", "ds.json",
                           "--num_gpus", "2", "-H", "x", "--", "--bogus"});
  EXPECT_EQ(o.num_gpus, 8);
  EXPECT_EQ(o.program, "./train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--deepspeed_config", "ds.json", "--num_gpus",
                                                      "2", "-H", "x", "--", "--bogus"}));
}

TEST(Options, AllSpellings) {
  const Options o = parse({"-H",
                           "hf",
                           "-i",
                           "a:0@b",
                           "--num_accelerators=4",
                           "--master_addr",
                           "10.0.0.1",
                           "--master_port=1234",
                           "--node_rank",
                           "1",
                           "--launcher",
                           "OpenMPI",
                           "--launcher_args",
                           "-x FOO --mca y",
                           "--no_ssh",
                           "--no_local_rank",
                           "--force_multi",
                           "--enable_each_rank_log",
                           "logs",
                           "--save_pid",
                           "--bind_cores_to_rank",
                           "--bind_core_list",
                           "0-3",
                           "--ssh_port",
                           "2222",
                           "--no_ssh_check",
                           "-q",
                           "prog"});
  EXPECT_EQ(o.hostfile, "hf");
  EXPECT_TRUE(o.hostfile_given);
  EXPECT_EQ(o.include, "a:0@b");
  EXPECT_EQ(o.num_gpus, 4);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.launcher, "openmpi");
  EXPECT_EQ(o.launcher_args, "-x FOO --mca y");
  EXPECT_TRUE(o.no_ssh && o.no_local_rank && o.force_multi && o.save_pid && o.bind_cores_to_rank);
  EXPECT_TRUE(o.no_ssh_check && o.quiet);
  EXPECT_EQ(o.log_level, "error");
  EXPECT_EQ(o.each_rank_log, "logs");
  EXPECT_EQ(o.bind_core_list, "0-3");
  EXPECT_EQ(o.ssh_port, 2222);
  EXPECT_EQ(o.save_pid_owner, 0);
}

TEST(Options, ShortOptionsWithAttachedValues) {
  const Options o = parse({"-Hhf", "-elocalhost:1", "prog"});
  EXPECT_EQ(o.hostfile, "hf");
  EXPECT_EQ(o.exclude, "localhost:1");
}

TEST(Options, InternalNodeMode) {
  const Options o = parse({"--world_info=abc", "--node_rank=1", "prog"});
  EXPECT_EQ(o.node_rank, 1);
  ASSERT_TRUE(o.world_info.has_value());
  EXPECT_EQ(*o.world_info, "abc");
  EXPECT_THROW(parse({"--world_info=abc", "--node_rank=x", "prog"}), UsageError);
  const Options p = parse({"--world_info=abc", "--save_pid=42", "--exit_on_stdin_eof", "prog"});
  EXPECT_TRUE(p.save_pid);
  EXPECT_EQ(p.save_pid_owner, 42);
  EXPECT_TRUE(p.exit_on_stdin_eof);
}

TEST(Options, PythonOnlyFlagsAreAccepted) {
  const Options o = parse({"--module", "--no_python", "prog"});
  EXPECT_TRUE(o.module);
  EXPECT_TRUE(o.no_python);
}

TEST(Options, NoneDisablesRankLogsLikeDeepSpeed) {
  EXPECT_TRUE(parse({"--enable_each_rank_log", "None", "prog"}).each_rank_log.empty());
}

// dscpp's own: 0 asks for a free port; a per-node launcher of a multi-node job cannot take it.
TEST(Options, MasterPortZeroMeansAFreePort) {
  EXPECT_EQ(parse({"--master_port", "0", "prog"}).master_port, 0);
  try {
    parse({"--world_info=abc", "--master_port=0", "prog"});
    ADD_FAILURE() << "--world_info with --master_port 0 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--master_port 0 (a free port) needs a single-node job"),
              std::string::npos)
        << e.what();
  }
}

TEST(Options, UsageErrors) {
  EXPECT_THROW(parse({}), UsageError);
  EXPECT_THROW(parse({"--num_gpus", "2"}), UsageError);
  EXPECT_THROW(parse({"--bogus", "prog"}), UsageError);
  EXPECT_THROW(parse({"-Z", "prog"}), UsageError);
  EXPECT_THROW(parse({"--num_gpus", "two", "prog"}), UsageError);
  EXPECT_THROW(parse({"--num_g", "2", "prog"}), UsageError);  // no prefix guessing
  EXPECT_THROW(parse({"--master_port", "70000", "prog"}), UsageError);
  EXPECT_THROW(parse({"--master_port", "-1", "prog"}), UsageError);
  EXPECT_THROW(parse({"--log_level", "loud", "prog"}), UsageError);
  EXPECT_THROW(parse({"--no_ssh=yes", "prog"}), UsageError);
  EXPECT_THROW(parse({"--num_gpus=2", "--num_accelerators=3", "prog"}), UsageError);
  EXPECT_THROW(parse({"--hostfile"}), UsageError);
}

// DeepSpeed's -1 means "not given"; given, 0 or a negative count used to start one
// rank silently.
TEST(Options, CountsMustBePositive) {
  for (const char* bad : {"0", "-1", "-5"}) {
    try {
      parse({"--num_gpus", bad, "prog"});
      ADD_FAILURE() << "--num_gpus " << bad << " accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--num_gpus ") + bad +
                                           ": expected a positive number of ranks per node"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(parse({"--num_accelerators", bad, "prog"}), UsageError);
    EXPECT_THROW(parse({"--num_nodes", bad, "prog"}), UsageError);
  }
  EXPECT_EQ(parse({"--num_gpus", "1", "prog"}).num_gpus, 1);
  EXPECT_EQ(parse({"prog"}).num_gpus, -1);  // not given
  EXPECT_TRUE(parse({"--oversubscribe", "prog"}).oversubscribe);
  EXPECT_FALSE(parse({"prog"}).oversubscribe);
}

TEST(Options, HelpNeedsNoProgram) {
  EXPECT_TRUE(parse({"--help"}).help);
  EXPECT_NE(usage_text().find("--enable_each_rank_log"), std::string::npos);
  EXPECT_EQ(usage_text().find("world_info"), std::string::npos);
}

}  // namespace
}  // namespace dscpp::launcher
