#include <gtest/gtest.h>

#include "multinode_runner.h"
#include "world_info.h"

namespace dscpp::launcher {
namespace {

RunnerInputs inputs(const std::string& launcher) {
  RunnerInputs in;
  in.launcher = launcher;
  in.active = {{"worker-0", {0, 1}}, {"worker-1", {0, 1}}};
  in.pool = {{"worker-0", 2}, {"worker-1", 2}};
  in.hostfile = "/job/hostfile";
  in.world_info = encode_world_info(in.active);
  in.master_addr = "10.0.0.1";
  in.master_port = 29500;
  in.dscpp_path = "/opt/dscpp/bin/dscpp";
  in.cwd = "/home/u/run";
  in.program = "./train";
  in.program_args = {"--deepspeed_config", "ds.json", "two words"};
  in.exports = {{"NCCL_DEBUG", "INFO"}, {"MSG", "it's here"}};
  return in;
}

const std::string kWorld = "eyJ3b3JrZXItMCI6IFswLCAxXSwgIndvcmtlci0xIjogWzAsIDFdfQ==";

TEST(PdshRunner, CommandLine) {
  const RunnerInputs in = inputs("pdsh");
  ASSERT_EQ(in.world_info, kWorld);
  const Argv expected = {"pdsh",
                         "-S",
                         "-f",
                         "1024",
                         "-w",
                         "worker-0,worker-1",
                         "export NCCL_DEBUG=INFO; export MSG='it'\\''s here'; ",
                         "cd /home/u/run;",
                         "/opt/dscpp/bin/dscpp",
                         "--world_info=" + kWorld,
                         "--node_rank=%n",
                         "--master_addr=10.0.0.1",
                         "--master_port=29500",
                         "./train",
                         "--deepspeed_config",
                         "ds.json",
                         "'two words'"};
  EXPECT_EQ(pdsh_command(in), expected);
}

TEST(PdshRunner, ForwardsPerNodeFlagsLauncherArgsAndVenv) {
  RunnerInputs in = inputs("pdsh");
  in.exports.clear();
  in.program_args.clear();
  in.launcher_args = "-l 'user name'";
  in.venv_script = "/venv/bin/activate";
  in.no_local_rank = true;
  in.save_pid = true;
  in.save_pid_owner = 4242;
  in.each_rank_log = "logs";
  in.bind_cores_to_rank = true;
  in.bind_core_list = "0-7";
  const Argv expected = {"pdsh",
                         "-S",
                         "-f",
                         "1024",
                         "-w",
                         "worker-0,worker-1",
                         "-l",
                         "user name",
                         "source /venv/bin/activate;",
                         "",
                         "cd /home/u/run;",
                         "/opt/dscpp/bin/dscpp",
                         "--world_info=" + kWorld,
                         "--node_rank=%n",
                         "--master_addr=10.0.0.1",
                         "--master_port=29500",
                         "--no_local_rank",
                         "--save_pid=4242",
                         "--enable_each_rank_log=logs",
                         "--bind_cores_to_rank",
                         "--bind_core_list=0-7",
                         "./train"};
  EXPECT_EQ(pdsh_command(in), expected);
}

TEST(PdshRunner, KillCommandDoesNotMatchItsOwnShell) {
  const Argv expected = {"pdsh",  "-S", "-f",
                         "1024",  "-w", "worker-0,worker-1",
                         "pkill", "-f", "'[-]-world_info=" + kWorld + " --node_rank='"};
  EXPECT_EQ(pdsh_kill_command(inputs("pdsh")), expected);
}

TEST(PdshRunner, FailedNodeLineGivesItsExitCode) {
  EXPECT_EQ(pdsh_failed_node("pdsh@vm: 10.77.0.2: ssh exited with exit code 3"), 3);
  EXPECT_EQ(pdsh_failed_node("pdsh@head: worker-1: ssh exited with exit code 255"), 255);
  // A rank's own output that merely looks alike, or pdsh's other lines, are not failures.
  EXPECT_EQ(pdsh_failed_node("worker-1: pdsh@x: y: ssh exited with exit code 3"), std::nullopt);
  EXPECT_EQ(pdsh_failed_node("pdsh@head: worker-1: connect: Connection refused"), std::nullopt);
  EXPECT_EQ(pdsh_failed_node("pdsh@head: worker-1: ssh exited with exit code x"), std::nullopt);
}

TEST(PdshRunner, Environment) {
  RunnerInputs in = inputs("pdsh");
  EXPECT_EQ(pdsh_environment(in, {}), (EnvList{{"PDSH_RCMD_TYPE", "ssh"}}));
  in.ssh_port = 2222;
  EXPECT_EQ(pdsh_environment(in, {{"PDSH_SSH_ARGS_APPEND", "-q"}}),
            (EnvList{{"PDSH_RCMD_TYPE", "ssh"}, {"PDSH_SSH_ARGS_APPEND", "-q -p 2222"}}));
}

TEST(OpenMpiRunner, CommandLine) {
  const Argv expected = {"mpirun",
                         "-n",
                         "4",
                         "-hostfile",
                         "/job/hostfile",
                         "--mca",
                         "btl",
                         "^openib",
                         "--mca",
                         "btl_tcp_if_include",
                         "eth0",
                         "-x",
                         "UCX_TLS=tcp",
                         "-x",
                         "NCCL_DEBUG=INFO",
                         "-x",
                         "MSG=it's here",
                         "-x",
                         "MASTER_ADDR=10.0.0.1",
                         "-x",
                         "MASTER_PORT=29500",
                         "./train",
                         "--deepspeed_config",
                         "ds.json",
                         "two words"};
  EXPECT_EQ(openmpi_command(inputs("openmpi")), expected);
}

TEST(OpenMpiRunner, UserInterfaceChoiceReplacesEth0) {
  RunnerInputs in = inputs("openmpi");
  in.exports.clear();
  in.program_args.clear();
  in.launcher_args = "--mca btl_tcp_if_include ib0 --oversubscribe";
  const Argv expected = {"mpirun",
                         "-n",
                         "4",
                         "-hostfile",
                         "/job/hostfile",
                         "--mca",
                         "btl",
                         "^openib",
                         "--mca",
                         "btl_tcp_if_include",
                         "ib0",
                         "--oversubscribe",
                         "-x",
                         "UCX_TLS=tcp",
                         "-x",
                         "MASTER_ADDR=10.0.0.1",
                         "-x",
                         "MASTER_PORT=29500",
                         "./train"};
  EXPECT_EQ(openmpi_command(in), expected);
}

TEST(MpichRunner, CommandLine) {
  const Argv expected = {"mpirun",
                         "-n",
                         "4",
                         "-ppn",
                         "2",
                         "-genv",
                         "NCCL_DEBUG",
                         "INFO",
                         "-genv",
                         "MSG",
                         "it's here",
                         "-genv",
                         "MASTER_ADDR",
                         "10.0.0.1",
                         "-genv",
                         "MASTER_PORT",
                         "29500",
                         "-genv",
                         "WORLD_SIZE",
                         "4",
                         "-genv",
                         "LOCAL_SIZE",
                         "2",
                         "-hosts",
                         "worker-0,worker-1",
                         "./train",
                         "--deepspeed_config",
                         "ds.json",
                         "two words"};
  EXPECT_EQ(mpich_command(inputs("mpich")), expected);
}

TEST(SlurmRunner, CommandLine) {
  const Argv expected = {
      "srun",
      "-n",
      "4",
      "--export=ALL,NCCL_DEBUG=INFO,MSG=it's here,MASTER_ADDR=10.0.0.1,MASTER_PORT=29500",
      "./train",
      "--deepspeed_config",
      "ds.json",
      "two words"};
  EXPECT_EQ(slurm_command(inputs("slurm")), expected);
}

TEST(SlurmRunner, FiltersBecomeNodeListsAndCounts) {
  RunnerInputs in = inputs("slurm");
  in.exports.clear();
  in.program_args.clear();
  in.include = "worker-1";
  in.active = {{"worker-1", {0, 1}}};
  in.launcher_args = "-p gpu";
  EXPECT_EQ(slurm_command(in),
            (Argv{"srun", "-n", "2", "-p", "gpu", "--nodelist", "worker-1", "--nodes", "1",
                  "--export=ALL,MASTER_ADDR=10.0.0.1,MASTER_PORT=29500", "./train"}));
  in.include.clear();
  in.launcher_args.clear();
  in.num_nodes = 1;
  in.num_gpus = 2;
  EXPECT_EQ(slurm_command(in),
            (Argv{"srun", "-n", "2", "--nodes", "1", "--gpus-per-node", "2",
                  "--export=ALL,MASTER_ADDR=10.0.0.1,MASTER_PORT=29500", "./train"}));
}

TEST(SshRunner, OneCommandPerHost) {
  RunnerInputs in = inputs("ssh");
  in.ssh_port = 2222;
  in.launcher_args = "-o StrictHostKeyChecking=no";
  const std::vector<Argv> cmds = ssh_commands(in);
  ASSERT_EQ(cmds.size(), 2u);
  const std::string remote =
      "export NCCL_DEBUG=INFO; export MSG='it'\\''s here'; cd /home/u/run; /opt/dscpp/bin/dscpp "
      "--world_info=" +
      kWorld +
      " --node_rank=1 --master_addr=10.0.0.1 --master_port=29500 "
      "--exit_on_stdin_eof ./train --deepspeed_config ds.json 'two words'";
  EXPECT_EQ(cmds[1],
            (Argv{"ssh", "-p", "2222", "-o", "StrictHostKeyChecking=no", "worker-1", remote}));
  EXPECT_EQ(cmds[0][5], "worker-0");
  EXPECT_NE(cmds[0][6].find("--node_rank=0 "), std::string::npos);
}

TEST(RunnerValidation, BackendsThatCannotFilter) {
  for (const char* launcher : {"openmpi", "mpich"}) {
    RunnerInputs in = inputs(launcher);
    EXPECT_NO_THROW(validate_runner(in));
    in.include = "worker-0";
    EXPECT_THROW(validate_runner(in), RunnerError) << launcher;
    in = inputs(launcher);
    in.num_gpus = 1;
    EXPECT_THROW(validate_runner(in), RunnerError) << launcher;
  }
  RunnerInputs uneven = inputs("mpich");
  uneven.pool = {{"worker-0", 2}, {"worker-1", 4}};
  EXPECT_THROW(validate_runner(uneven), RunnerError);
  EXPECT_THROW(validate_runner(inputs("mvapich")), RunnerError);
}

TEST(RunnerValidation, SlurmNeedsLeadingSlotsAndEqualCounts) {
  EXPECT_NO_THROW(validate_active_resources("slurm", {{"a", {0, 1}}, {"b", {0, 1}}}));
  EXPECT_THROW(validate_active_resources("slurm", {{"a", {0, 2}}}), RunnerError);
  EXPECT_THROW(validate_active_resources("slurm", {{"a", {0, 1}}, {"b", {0}}}), RunnerError);
  EXPECT_NO_THROW(validate_active_resources("pdsh", {{"a", {0, 2}}, {"b", {1}}}));
}

TEST(Shell, SplitLikeShlex) {
  EXPECT_EQ(shlex_split(R"( a "b c" 'd e' f\ g "h\"i" ''  )"),
            (std::vector<std::string>{"a", "b c", "d e", "f g", "h\"i", ""}));
  EXPECT_TRUE(shlex_split("").empty());
  EXPECT_THROW(shlex_split("'open"), RunnerError);
  EXPECT_THROW(shlex_split("\"open"), RunnerError);
}

TEST(Shell, QuoteOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_quote("--node_rank=%n"), "--node_rank=%n");
  EXPECT_EQ(shell_quote("/a/b-c_d.e:f,g@h+i"), "/a/b-c_d.e:f,g@h+i");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
}

}  // namespace
}  // namespace dscpp::launcher
