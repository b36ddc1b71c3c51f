// End-to-end tests: the real dscpp binary starting fake_rank processes.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <regex>
#include <set>
#include <sstream>

#include "process_harness.h"

namespace dscpp::launcher::testing {
namespace {

bool has_gpu() {
  return file_exists("/proc/driver/nvidia/gpus") || file_exists("/dev/nvidia0");
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (file_exists("/job/hostfile")) {
      GTEST_SKIP() << "/job/hostfile exists on this machine";
    }
  }

  std::vector<RankInfo> ranks(int n) {
    std::vector<RankInfo> out;
    for (int r = 0; r < n; ++r) {
      auto info = read_rank(dir_.path(), r);
      EXPECT_TRUE(info.has_value()) << "rank " << r << " wrote nothing";
      if (info) out.push_back(*info);
    }
    return out;
  }

  std::string out_arg() const { return "out=" + dir_.path(); }

  TempDir dir_;
};

void expect_nothing_left(const std::vector<RankInfo>& ranks, double timeout_s = 0) {
  const auto alive = still_alive(ranks, timeout_s);
  std::ostringstream list;
  for (pid_t p : alive) list << p << " ";
  EXPECT_TRUE(alive.empty()) << "still running (negative: process group): " << list.str();
}

TEST_F(ProcessTest, EnvironmentOfFourRanks) {
  const Result r = run_dscpp({"--num_gpus", "4", "--master_port", "29611", kFakeRank, out_arg(),
                              "--flag", "two words", "--num_gpus", "9"},
                             {{"INHERITED", "yes"}});
  ASSERT_EQ(r.code, 0) << r.err;
  if (!has_gpu()) {
    EXPECT_NE(r.err.find("dscpp: no GPU found, starting 4 CPU ranks"), std::string::npos) << r.err;
  }
  const auto all = ranks(4);
  ASSERT_EQ(all.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const RankInfo& info = all[i];
    const std::map<std::string, std::string> expected = {
        {"RANK", std::to_string(i)},
        {"LOCAL_RANK", std::to_string(i)},
        {"WORLD_SIZE", "4"},
        {"LOCAL_SIZE", "4"},
        {"CROSS_RANK", "0"},
        {"CROSS_SIZE", "1"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", "29611"},
        // hidden on a GPU machine
        {"CUDA_VISIBLE_DEVICES", has_gpu() ? "" : "0,1,2,3"},
        {"INHERITED", "yes"}};
    for (const auto& [name, value] : expected) EXPECT_EQ(info.env.at(name), value) << name;
    EXPECT_EQ(info.args, (std::vector<std::string>{"--local_rank=" + std::to_string(i), out_arg(),
                                                   "--flag", "two words", "--num_gpus", "9"}));
    EXPECT_EQ(info.pgid, info.pid) << "each rank leads its own process group";
    EXPECT_FALSE(info.signals_blocked) << "the launcher's signal mask leaked into the rank";
    EXPECT_FALSE(info.sigpipe_ignored) << "the launcher's SIGPIPE action leaked into the rank";
  }
}

TEST_F(ProcessTest, NoLocalRank) {
  const Result r = run_dscpp({"--no_local_rank", "--num_gpus", "2", kFakeRank, out_arg(), "x"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const RankInfo& info : ranks(2)) {
    EXPECT_EQ(info.args, (std::vector<std::string>{out_arg(), "x"}));
  }
}

TEST_F(ProcessTest, FailingRankStopsTheJobWithItsExitCode) {
  const Result r = run_dscpp({"--num_gpus", "4", kFakeRank, out_arg(), "wait_peers=1",
                              "grandchild=1", "exit=1:7", "sleep=30"},
                             {{"DSCPP_KILL_GRACE_S", "3"}});
  EXPECT_EQ(r.code, 7) << r.err;
  EXPECT_LT(r.seconds, 3.0) << "the others should stop on SIGTERM, well within the grace period";
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
  expect_nothing_left(ranks(4));
}

// A rank that fails after a peer already finished (a peer's exit is a common cause of a
// "connection reset by peer"): the message says the peer had ended, and how.
TEST_F(ProcessTest, FailureNamesThePeersThatHadAlreadyEnded) {
  const Result r =
      run_dscpp({"--num_gpus", "2", kFakeRank, out_arg(), "exit=1:0", "late_exit=0:5", "sleep=1"});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_NE(r.err.find("rank 0 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("already ended: rank 1 exited with code 0)"), std::string::npos) << r.err;
  expect_nothing_left(ranks(2));
}

TEST_F(ProcessTest, RankKilledBySignalGives128PlusSignal) {
  const Result r = run_dscpp(
      {"--num_gpus", "3", kFakeRank, out_arg(), "wait_peers=1", "signal=2:6", "sleep=30"});
  EXPECT_EQ(r.code, 128 + SIGABRT) << r.err;
  expect_nothing_left(ranks(3));
}

TEST_F(ProcessTest, KillMinus9OfOneRank) {
  Launch launch({"--num_gpus", "3", kFakeRank, out_arg(), "grandchild=1", "sleep=30"}, {}, "/tmp");
  ASSERT_TRUE(wait_for_ranks(dir_.path(), 3));
  const auto all = ranks(3);
  ASSERT_EQ(::kill(all[1].pid, SIGKILL), 0);
  const Result r = launch.wait();
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.err;
  EXPECT_LT(r.seconds, 4.0);
  expect_nothing_left(all);
}

TEST_F(ProcessTest, SignalsToTheLauncherAreForwardedThenTornDown) {
  for (int signo : {SIGINT, SIGTERM}) {
    TempDir dir;
    Launch launch({"--num_gpus", "2", kFakeRank, "out=" + dir.path(), "grandchild=1", "sleep=30"},
                  {}, "/tmp");
    ASSERT_TRUE(wait_for_ranks(dir.path(), 2));
    std::vector<RankInfo> all = {*read_rank(dir.path(), 0), *read_rank(dir.path(), 1)};
    ASSERT_EQ(::kill(launch.pid(), signo), 0);
    const Result r = launch.wait();
    EXPECT_EQ(r.code, 128 + signo) << r.err;
    EXPECT_LT(r.seconds, 4.0);
    expect_nothing_left(all);
  }
}

TEST_F(ProcessTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  const Result r = run_dscpp({"--num_gpus", "2", kFakeRank, out_arg(), "wait_peers=1",
                              "grandchild=1", "ignore_term=1", "exit=0:3", "sleep=30"},
                             {{"DSCPP_KILL_GRACE_S", "1"}});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_GE(r.seconds, 1.0);
  EXPECT_LT(r.seconds, 4.0);
  expect_nothing_left(ranks(2));
}

TEST_F(ProcessTest, GrandchildThatLeftTheProcessGroupIsStoppedToo) {
  const Result r = run_dscpp({"--num_gpus", "2", kFakeRank, out_arg(), "wait_peers=1",
                              "grandchild=setsid", "exit=0:5", "sleep=30"},
                             {{"DSCPP_KILL_GRACE_S", "3"}});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_LT(r.seconds, 3.0);
  expect_nothing_left(ranks(2));
}

TEST_F(ProcessTest, SuccessfulRanksLeaveNoDaemonBehind) {
  const Result r = run_dscpp({"--num_gpus", "2", kFakeRank, out_arg(), "grandchild=1"},
                             {{"DSCPP_KILL_GRACE_S", "3"}});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_LT(r.seconds, 3.0);
  expect_nothing_left(ranks(2));
}

TEST_F(ProcessTest, KillMinus9OfTheLauncherTakesRanksAndGrandchildrenDown) {
  Launch launch({"--num_gpus", "2", kFakeRank, out_arg(), "grandchild=1", "sleep=30"}, {}, "/tmp");
  ASSERT_TRUE(wait_for_ranks(dir_.path(), 2));
  const auto all = ranks(2);
  ASSERT_EQ(::kill(launch.pid(), SIGKILL), 0);
  EXPECT_EQ(launch.wait().code, 128 + SIGKILL);
  expect_nothing_left(all, 5.0);
}

TEST_F(ProcessTest, TwoNoSshLaunchersFormOneJob) {
  write_file(dir_ / "hostfile", "localhost slots=2\n127.0.0.1 slots=2\n");
  const std::vector<std::string> common = {"-H", dir_ / "hostfile", "--no_ssh", "--master_port",
                                           "29612"};
  auto args = [&](int node) {
    std::vector<std::string> a = common;
    a.insert(a.end(), {"--node_rank", std::to_string(node), kFakeRank, out_arg(), "wait_peers=1"});
    return a;
  };
  Launch node0(args(0), {}, "/tmp");
  Launch node1(args(1), {}, "/tmp");
  const Result r0 = node0.wait(), r1 = node1.wait();
  ASSERT_EQ(r0.code, 0) << r0.err;
  ASSERT_EQ(r1.code, 0) << r1.err;
  const auto all = ranks(4);
  ASSERT_EQ(all.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const auto& env = all[i].env;
    EXPECT_EQ(env.at("RANK"), std::to_string(i));
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(i % 2));
    EXPECT_EQ(env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("LOCAL_SIZE"), "2");
    EXPECT_EQ(env.at("CROSS_RANK"), std::to_string(i / 2));
    EXPECT_EQ(env.at("CROSS_SIZE"), "2");
    EXPECT_EQ(env.at("MASTER_ADDR"), "localhost");
    EXPECT_EQ(env.at("MASTER_PORT"), "29612");
    EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "0,1");
    EXPECT_EQ(all[i].args.front(), "--local_rank=" + std::to_string(i % 2));
  }
}

TEST_F(ProcessTest, EachRankLog) {
  const std::string logs = dir_ / "logs/nested";
  const Result r =
      run_dscpp({"--enable_each_rank_log", logs, "--num_gpus", "2", kFakeRank, "print=hello"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("hello"), std::string::npos) << r.out;
  std::vector<std::string> names;
  DIR* d = ::opendir(logs.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(std::regex_match(names[rank],
                                 std::regex("[0-9]{14}_rank" + std::to_string(rank) + "\\.log")))
        << names[rank];
    EXPECT_EQ(read_file(logs + "/" + names[rank]), "hello rank " + std::to_string(rank) +
                                                       "\nstderr hello rank " +
                                                       std::to_string(rank) + "\n");
  }
}

TEST_F(ProcessTest, DeepspeedEnvFilesAreExported) {
  TempDir home;
  write_file(dir_ / ".deepspeed_env", "FOO=from cwd\nBOTH=cwd\n");
  write_file(home / ".deepspeed_env", "# home file\nBOTH=home\nHOMEONLY=1\n");
  const Result r =
      run_dscpp({"--num_gpus", "2", kFakeRank, out_arg()}, {{"HOME", home.path()}}, dir_.path());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const RankInfo& info : ranks(2)) {
    EXPECT_EQ(info.env.at("FOO"), "from cwd");
    EXPECT_EQ(info.env.at("BOTH"), "cwd");
    EXPECT_EQ(info.env.at("HOMEONLY"), "1");
  }
}

TEST_F(ProcessTest, CudaVisibleDevicesSelectsTheSlots) {
  if (has_gpu()) {
    GTEST_SKIP() << "needs a machine without GPUs";
  }
  const Result r = run_dscpp({kFakeRank, out_arg()}, {{"CUDA_VISIBLE_DEVICES", "1,3"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("starting 2 CPU ranks"), std::string::npos) << r.err;
  const auto all = ranks(2);
  ASSERT_EQ(all.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(all[i].env.at("CUDA_VISIBLE_DEVICES"), "1,3");
    EXPECT_EQ(all[i].env.at("LOCAL_RANK"), std::to_string(i));
  }
}

TEST_F(ProcessTest, BindCoresToRank) {
  cpu_set_t cpus;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  if (!CPU_ISSET(0, &cpus) || !CPU_ISSET(1, &cpus)) {
    GTEST_SKIP() << "needs CPUs 0 and 1";
  }
  const Result r = run_dscpp(
      {"--bind_cores_to_rank", "--bind_core_list", "0,1", "--num_gpus", "2", kFakeRank, out_arg()});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto all = ranks(2);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].affinity, "0");
  EXPECT_EQ(all[1].affinity, "1");
  EXPECT_EQ(all[1].env.at("OMP_NUM_THREADS"), "1");
}

TEST_F(ProcessTest, SavePid) {
  Launch launch(
      {"--save_pid", "--num_gpus", "2", kFakeRank, out_arg(), "wait_file=" + (dir_ / "go")}, {},
      "/tmp");
  ASSERT_TRUE(wait_for_ranks(dir_.path(), 2));
  const std::string pid_file = "/tmp/" + std::to_string(launch.pid()) + ".deepspeed";
  // The rank list is written once every rank is started, possibly after they wrote theirs.
  for (int i = 0; i < 1000 && !file_exists(pid_file + ".ranks"); ++i) ::usleep(5000);
  EXPECT_EQ(read_file(pid_file), std::to_string(launch.pid()));
  const auto all = ranks(2);
  EXPECT_EQ(read_file(pid_file + ".ranks"),
            std::to_string(all[0].pid) + "\n" + std::to_string(all[1].pid) + "\n");
  write_file(dir_ / "go", "");
  const Result r = launch.wait();
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("launcher pid: " + std::to_string(launch.pid())), std::string::npos);
  EXPECT_FALSE(file_exists(pid_file));
  EXPECT_FALSE(file_exists(pid_file + ".ranks"));
}

// A launcher killed with SIGKILL cannot remove its --save_pid files; the next launch does,
// once their launcher is gone (the guardian has stopped its ranks). Under ctest -j another
// test's launch may be that next launch and remove them first: that is the behaviour under
// test too, so then only the end state is checked.
TEST_F(ProcessTest, SavePidFilesOfAKilledLauncherAreRemovedByTheNextLaunch) {
  Launch launch({"--save_pid", "--num_gpus", "2", kFakeRank, out_arg(), "sleep=30"}, {}, "/tmp");
  ASSERT_TRUE(wait_for_ranks(dir_.path(), 2));
  const std::string pid_file = "/tmp/" + std::to_string(launch.pid()) + ".deepspeed";
  for (int i = 0; i < 1000 && !file_exists(pid_file + ".ranks"); ++i) ::usleep(5000);
  ASSERT_TRUE(file_exists(pid_file));
  ASSERT_EQ(::kill(launch.pid(), SIGKILL), 0);
  EXPECT_EQ(launch.wait().code, 128 + SIGKILL);
  expect_nothing_left(ranks(2), 10);
  TempDir other;
  const Result r = run_dscpp({"--num_gpus", "1", kFakeRank, "out=" + other.path()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(file_exists(pid_file));
  EXPECT_FALSE(file_exists(pid_file + ".ranks"));
}

// `dscpp ... 2>&1 | head` after head has exited: the launcher's messages fail with EPIPE, and
// it still stops the other ranks with SIGTERM (rank 1 records it) and exits with the failing
// rank's code, not by an abort; whether it starts with SIGPIPE's default action (a shell's)
// or ignoring it (a Python parent's), with its notices on (the first write is before any rank
// starts) or off (the first is the teardown's).
TEST_F(ProcessTest, AClosedOutputPipeDoesNotStopTheTeardown) {
  for (const auto output :
       {Launch::Output::kClosedPipe, Launch::Output::kClosedPipeSigpipeIgnored}) {
    for (const std::string level : {"info", "error"}) {
      SCOPED_TRACE((output == Launch::Output::kClosedPipe ? "SIGPIPE default, log level "
                                                          : "SIGPIPE ignored, log level ") +
                   level);
      TempDir dir;
      Launch launch({"--log_level", level, "--num_gpus", "2", kFakeRank, "out=" + dir.path(),
                     "wait_peers=1", "on_term=1", "exit=0:3", "sleep=30"},
                    {{"DSCPP_KILL_GRACE_S", "20"}}, "/tmp", output);
      const Result r = launch.wait(30);
      EXPECT_EQ(r.code, 3);
      EXPECT_TRUE(file_exists(dir / "rank1.term")) << "rank 1 got no SIGTERM";
      EXPECT_LT(r.seconds, 20.0) << "rank 1 was left to the grace period";
      for (int rank = 0; rank < 2; ++rank) {
        const auto info = read_rank(dir.path(), rank);
        ASSERT_TRUE(info.has_value()) << "rank " << rank << " wrote nothing";
        expect_nothing_left({*info});
      }
    }
  }
  // Ranks that print into the closed pipe die of SIGPIPE (its default action is theirs, as
  // without a launcher), and the launcher reports that as a rank's failure: 128 + SIGPIPE.
  TempDir dir;
  Launch printing(
      {"--num_gpus", "2", kFakeRank, "out=" + dir.path(), "wait_peers=1", "print=hello"}, {},
      "/tmp", Launch::Output::kClosedPipe);
  EXPECT_EQ(printing.wait(30).code, 128 + SIGPIPE);
  for (int rank = 0; rank < 2; ++rank) {
    const auto info = read_rank(dir.path(), rank);
    ASSERT_TRUE(info.has_value()) << "rank " << rank << " wrote nothing";
    expect_nothing_left({*info});
  }
}

// The master address is resolved before any rank starts: an address that names no host is
// an error naming it at once (not after the rendezvous gives up). None of these is looked up
// on the network: 256.1.1.1 is refused by its form, .invalid by RFC 6761.
TEST_F(ProcessTest, AnUnresolvableMasterAddressIsRefusedBeforeAnyRankStarts) {
  for (const std::string addr : {"256.1.1.1", "10.0.0.300", "node7.invalid", "INVALID."}) {
    SCOPED_TRACE(addr);
    const Result r =
        run_dscpp({"--num_gpus", "2", "--master_addr", addr, kFakeRank, out_arg(), "sleep=30"});
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("dscpp: error: the master address '" + addr + "' (--master_addr)"),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(read_rank(dir_.path(), 0).has_value()) << "a rank started";
  }
  // inet_aton's short form is an address (what getaddrinfo and the ranks accept).
  const Result ok = run_dscpp({"--num_gpus", "1", "--master_addr", "127.1", kFakeRank, out_arg()});
  EXPECT_EQ(ok.code, 0) << ok.err;
}

void expect_usage_error(const std::vector<std::string>& args, const std::string& fragment,
                        const std::string& cwd = "/tmp") {
  const Result r = run_dscpp(args, {}, cwd);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("dscpp: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

TEST_F(ProcessTest, UsageErrorsExitWith2) {
  write_file(dir_ / "bad", "worker-0 slots=2\nworker-1 slotz=2\n");
  write_file(dir_ / "dup", "worker-0 slots=2\nworker-0 slots=2\n");
  write_file(dir_ / "two", "worker-0 slots=2\nworker-1 slots=2\n");
  expect_usage_error({"--bogus", kFakeRank}, "unrecognized option '--bogus'");
  expect_usage_error({"--num_gpus", "2"}, "program to launch is missing");
  expect_usage_error({"./no-such-program"},
                     "cannot find an executable program './no-such-program'");
  expect_usage_error({"-H", dir_ / "bad", kFakeRank}, ":2: bad entry");
  expect_usage_error({"-H", dir_ / "dup", kFakeRank}, ":2: host 'worker-0'");
  expect_usage_error({"-H", dir_ / "missing", kFakeRank}, "does not exist");
  expect_usage_error({"-H", dir_ / "two", "-i", "worker-7", kFakeRank},
                     "Hostname 'worker-7' not found");
  expect_usage_error({"-H", dir_ / "two", "-e", "worker-1:5", kFakeRank}, "No slot '5'");
  expect_usage_error({"-H", dir_ / "two", "-i", "worker-0", "-e", "worker-1", kFakeRank},
                     "mutually exclusive");
  expect_usage_error({"--num_gpus", "1", "-i", "localhost", kFakeRank},
                     "Cannot specify num_nodes/gpus");
  expect_usage_error({"-H", dir_ / "two", "--no_ssh", "--node_rank", "2", kFakeRank},
                     "--node_rank");
  // Counts that are not counts, and CPU ranks far beyond the machine.
  expect_usage_error({"--num_gpus", "0", kFakeRank}, "--num_gpus 0: expected a positive number");
  expect_usage_error({"--num_gpus", "-1", kFakeRank}, "--num_gpus -1: expected a positive number");
  write_file(dir_ / "nul", std::string("worker-0 slots=2\nwork\0er-1 slots=2\n", 36));
  expect_usage_error({"-H", dir_ / "nul", kFakeRank}, "nul:2:5: control byte 0x00");
  if (!has_gpu()) {
    expect_usage_error({"--num_gpus", "10000", kFakeRank}, "pass --oversubscribe");
  }
}

// Every rank of one launch carries the same DSCPP_JOB_ID, a second launch another one, and
// a DSCPP_JOB_ID the user set is kept.
TEST_F(ProcessTest, RanksOfOneLaunchShareAJobId) {
  std::set<std::string> ids;
  for (int launch = 0; launch < 2; ++launch) {
    const Result r = run_dscpp({"--num_gpus", "2", kFakeRank, out_arg()});
    ASSERT_EQ(r.code, 0) << r.err;
    const auto all = ranks(2);
    ASSERT_EQ(all.size(), 2u);
    ASSERT_TRUE(all[0].env.count("DSCPP_JOB_ID"));
    EXPECT_EQ(all[0].env.at("DSCPP_JOB_ID"), all[1].env.at("DSCPP_JOB_ID"));
    ids.insert(all[0].env.at("DSCPP_JOB_ID"));
  }
  EXPECT_EQ(ids.size(), 2u);
  const Result r =
      run_dscpp({"--num_gpus", "2", kFakeRank, out_arg()}, {{"DSCPP_JOB_ID", "given"}});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const RankInfo& info : ranks(2)) EXPECT_EQ(info.env.at("DSCPP_JOB_ID"), "given");
}

// Multi-node backends, with pdsh and ssh replaced by scripts that run the remote command
// on this machine, so the whole path (command line, quoting, per-node launcher) is real.
class MultiNodeTest : public ProcessTest {
 protected:
  void SetUp() override {
    ProcessTest::SetUp();
    write_file(bin_ / "pdsh", R"SH(#!/bin/sh
# fake pdsh: run the command once per -w host, %n replaced by the host's index
while [ $# -gt 0 ]; do
  case "$1" in
    -S) shift ;;
    -f|-w) [ "$1" = -w ] && hosts="$2"; shift 2 ;;
    *) break ;;
  esac
done
cmd="$*"
i=0
pids=""
for h in $(echo "$hosts" | tr , ' '); do
  sh -c "$(printf '%s' "$cmd" | sed "s/%n/$i/g")" &
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do wait $p || rc=$?; done
exit $rc
)SH",
               true);
    write_file(bin_ / "ssh", R"SH(#!/bin/sh
# fake ssh: drop options and the host, run the command here
while [ $# -gt 0 ]; do
  case "$1" in
    -p|-o|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift
exec /bin/sh -c "$*"
)SH",
               true);
    write_file(dir_ / "hostfile", "localhost slots=2\n127.0.0.1 slots=2\n");
    path_ = bin_.path() + ":" +
            std::string(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin");
  }

  TempDir bin_;
  std::string path_;
};

TEST_F(MultiNodeTest, PdshStartsOneLauncherPerHost) {
  write_file(dir_ / ".deepspeed_env", "QUOTED=it's \"x\" $HOME\n");
  const Result r =
      run_dscpp({"-H", dir_ / "hostfile", "--master_addr", "127.0.0.1", "--master_port", "29613",
                 "--no_ssh_check", kFakeRank, out_arg(), "wait_peers=1", "two words", "$notavar"},
                {{"PATH", path_}, {"NCCL_DEBUG", "INFO"}}, dir_.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("dscpp: cmd = pdsh -S -f 1024 -w localhost,127.0.0.1"), std::string::npos)
      << r.err;
  const auto all = ranks(4);
  ASSERT_EQ(all.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const auto& env = all[i].env;
    EXPECT_EQ(env.at("RANK"), std::to_string(i));
    EXPECT_EQ(env.at("WORLD_SIZE"), "4");
    EXPECT_EQ(env.at("CROSS_RANK"), std::to_string(i / 2));
    EXPECT_EQ(env.at("CROSS_SIZE"), "2");
    EXPECT_EQ(env.at("MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(env.at("MASTER_PORT"), "29613");
    EXPECT_EQ(env.at("QUOTED"), "it's \"x\" $HOME");
    EXPECT_EQ(env.at("NCCL_DEBUG"), "INFO");
    EXPECT_EQ(all[i].args,
              (std::vector<std::string>{"--local_rank=" + std::to_string(i % 2), out_arg(),
                                        "wait_peers=1", "two words", "$notavar"}));
  }
}

TEST_F(MultiNodeTest, SshBackendTearsDownEveryHostWhenOneRankFails) {
  const Result r =
      run_dscpp({"-H", dir_ / "hostfile", "--launcher", "ssh", "--master_addr", "127.0.0.1",
                 kFakeRank, out_arg(), "wait_peers=1", "grandchild=1", "exit=3:7", "sleep=30"},
                {{"PATH", path_}, {"DSCPP_KILL_GRACE_S", "3"}}, dir_.path());
  EXPECT_EQ(r.code, 7) << r.err;
  EXPECT_LT(r.seconds, 3.0);
  expect_nothing_left(ranks(4));
}

TEST_F(MultiNodeTest, MissingBackendIsAUsageError) {
  const Result r =
      run_dscpp({"-H", dir_ / "hostfile", "--launcher", "slurm", "--master_addr", "x", kFakeRank},
                {{"PATH", "/nonexistent"}});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("launcher 'slurm' not installed"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dscpp::launcher::testing
