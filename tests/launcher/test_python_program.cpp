// The .py rule: a program ending in .py runs as `$DSCPP_PYTHON -u prog.py` (python3
// from PATH without it), --no_python runs it directly; the plan, the MPI runners' command lines,
// and real launches (check_test_dist.py launches test_dist.py, torch's env:// all-reduce, apart:
// two torch imports outlast these tests' time limit on a loaded machine).
#include <gtest/gtest.h>

#include "multinode_runner.h"
#include "node_plan.h"
#include "process_harness.h"
#include "python_program.h"

#ifndef TEST_PYTHON
#error "TEST_PYTHON must name a Python interpreter"
#endif

namespace dscpp::launcher {
namespace {

NodeConfig node(const std::string& program, bool no_python) {
  NodeConfig c;
  c.world = {{"localhost", {0, 1}}};
  c.program = program;
  c.program_args = {"--x", "1"};
  c.no_python = no_python;
  c.python = "/opt/py/bin/python3";
  return c;
}

TEST(PythonProgram, OnlyADotPyNameRunsUnderTheInterpreter) {
  EXPECT_TRUE(runs_with_python("test_dist.py", false));
  EXPECT_TRUE(runs_with_python("/a/b/train.py", false));
  EXPECT_FALSE(runs_with_python("test_dist.py", true));
  EXPECT_FALSE(runs_with_python("./train_gpt", false));
  EXPECT_FALSE(runs_with_python(".py", false));
  EXPECT_FALSE(runs_with_python("train.pyc", false));
  EXPECT_EQ(python_interpreter({{"DSCPP_PYTHON", "/v/bin/python"}}), "/v/bin/python");
  EXPECT_EQ(python_interpreter({{"DSCPP_PYTHON", ""}}), "python3");
  EXPECT_EQ(python_interpreter({}), "python3");
}

TEST(PythonProgram, PlanPutsInterpreterThenScriptThenLocalRank) {
  const auto ranks = plan_node(node("train.py", false));
  ASSERT_EQ(ranks.size(), 2u);
  // DeepSpeed's launch.py: [sys.executable, "-u", script, "--local_rank=N", *args].
  EXPECT_EQ(ranks[1].argv, (std::vector<std::string>{"/opt/py/bin/python3", "-u", "train.py",
                                                     "--local_rank=1", "--x", "1"}));
  EXPECT_EQ(plan_node(node("train.py", true))[0].argv,
            (std::vector<std::string>{"train.py", "--local_rank=0", "--x", "1"}));
  EXPECT_EQ(plan_node(node("./train", false))[0].argv,
            (std::vector<std::string>{"./train", "--local_rank=0", "--x", "1"}));
}

TEST(PythonProgram, MpiRunnersPrefixTheInterpreterAndNodeLaunchersGetNoPython) {
  RunnerInputs in;
  in.launcher = "openmpi";
  in.active = {{"w0", {0}}, {"w1", {0}}};
  in.pool = {{"w0", 1}, {"w1", 1}};
  in.master_addr = "10.0.0.1";
  in.program = "train.py";
  in.program_args = {"--a"};
  in.python = "/v/python";
  for (const auto& cmd : {openmpi_command(in), mpich_command(in), slurm_command(in)}) {
    ASSERT_GE(cmd.size(), 4u);
    EXPECT_EQ((std::vector<std::string>(cmd.end() - 4, cmd.end())),
              (std::vector<std::string>{"/v/python", "-u", "train.py", "--a"}));
  }
  in.no_python = true;
  const Argv direct = openmpi_command(in);
  EXPECT_EQ((std::vector<std::string>(direct.end() - 2, direct.end())),
            (std::vector<std::string>{"train.py", "--a"}));
  const Argv flags = node_launcher_flags(in, "0");
  EXPECT_NE(std::find(flags.begin(), flags.end(), "--no_python"), flags.end());
}

using testing::run_dscpp;
using testing::TempDir;
using testing::write_file;

TEST(PythonProgramLaunch, Python3FromPathWithoutDscppPythonAndNoPythonRunsDirectly) {
  TempDir dir;
  write_file(dir / "python3", "#!/bin/sh\necho \"fake-python3 $*\"\n", true);
  write_file(dir / "job.py", "#!/bin/sh\necho \"direct $*\"\n", true);
  const std::string path = dir.path() + ":/usr/bin:/bin";
  auto r = run_dscpp({"--num_gpus=1", "job.py", "--a"}, {{"DSCPP_PYTHON", ""}, {"PATH", path}},
                     dir.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("fake-python3 -u job.py --local_rank=0 --a"), std::string::npos) << r.out;
  r = run_dscpp({"--num_gpus=1", "--no_python", "./job.py", "--a"},
                {{"DSCPP_PYTHON", ""}, {"PATH", path}}, dir.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("direct --local_rank=0 --a"), std::string::npos) << r.out;
}

TEST(PythonProgramLaunch, MissingInterpreterOrScriptIsNamed) {
  TempDir dir;
  write_file(dir / "job.py", "print('x')\n");
  auto r = run_dscpp({"--num_gpus=1", "job.py"}, {{"DSCPP_PYTHON", "/no/such/python"}}, dir.path());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("cannot find the Python interpreter '/no/such/python' to run job.py (set "
                       "DSCPP_PYTHON, or give --no_python"),
            std::string::npos)
      << r.err;
  r = run_dscpp({"--num_gpus=1", "gone.py"}, {{"DSCPP_PYTHON", TEST_PYTHON}}, dir.path());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("cannot find the Python program 'gone.py'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dscpp::launcher
