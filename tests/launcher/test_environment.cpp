#include <gtest/gtest.h>

#include <filesystem>

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "environment.h"
#include "errors.h"

namespace dscpp::launcher {
namespace {

TEST(EnvFile, ParsesNameValueLines) {
  const EnvList env = parse_env_file(
      "# comment\nNCCL_DEBUG=INFO\n\n  SPACED = a b \nEQ=x=y\nEMPTY=\nNCCL_DEBUG=WARN\n", "f");
  EXPECT_EQ(env,
            (EnvList{{"NCCL_DEBUG", "WARN"}, {"SPACED", "a b"}, {"EQ", "x=y"}, {"EMPTY", ""}}));
}

TEST(EnvFile, LineWithoutEqualsNamesTheLine) {
  try {
    parse_env_file("A=1\nnonsense\n", "/x/.deepspeed_env");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/x/.deepspeed_env:2"), std::string::npos);
  }
  EXPECT_THROW(parse_env_file("=value\n", "f"), UserError);
}

TEST(EnvFile, WorkingDirectoryOverridesHome) {
  char home[] = "/tmp/dscpp_home_XXXXXX";
  char cwd[] = "/tmp/dscpp_cwd_XXXXXX";
  ASSERT_NE(::mkdtemp(home), nullptr);
  ASSERT_NE(::mkdtemp(cwd), nullptr);
  std::ofstream(std::string(home) + "/.deepspeed_env") << "A=home\nB=home\n";
  std::ofstream(std::string(cwd) + "/.deepspeed_env") << "B=cwd\nC=cwd\n";
  std::ofstream(std::string(cwd) + "/custom_env") << "D=custom\n";
  EXPECT_EQ(read_deepspeed_env({{"HOME", home}}, cwd),
            (EnvList{{"A", "home"}, {"B", "cwd"}, {"C", "cwd"}}));
  EXPECT_EQ(read_deepspeed_env({{"HOME", home}, {"DS_ENV_FILE", "custom_env"}}, cwd),
            (EnvList{{"D", "custom"}}));
  EXPECT_EQ(
      read_deepspeed_env({{"HOME", home}, {"DS_ENV_FILE", std::string(cwd) + "/custom_env"}}, "/"),
      (EnvList{{"D", "custom"}}));
  EXPECT_TRUE(read_deepspeed_env({}, "/nonexistent").empty());
  std::filesystem::remove_all(home);
  std::filesystem::remove_all(cwd);
}

TEST(EnvFile, NulByteNamesTheLine) {
  try {
    parse_env_file(std::string("A=1\nB=x\0y\n", 10), "envf");
    ADD_FAILURE() << "NUL accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("envf:2:4: NUL byte"), std::string::npos) << e.what();
  }
}

// The id that keeps two jobs on one port apart (comm refuses a foreign store).
TEST(JobId, KeptWhenGivenElseFreshAndExported) {
  EnvList given = {{"DSCPP_JOB_ID", "mine"}};
  EXPECT_EQ(ensure_job_id(given), "mine");
  EXPECT_EQ(given, (EnvList{{"DSCPP_JOB_ID", "mine"}}));
  EnvList a, b;
  const std::string ia = ensure_job_id(a), ib = ensure_job_id(b);
  EXPECT_FALSE(ia.empty());
  EXPECT_NE(ia, ib);  // two launches of one process still differ (random part)
  EXPECT_EQ(get_env(a, "DSCPP_JOB_ID"), ia);
  // A multi-node runner carries it to every host.
  EXPECT_EQ(get_env(collect_exports(a, {}), "DSCPP_JOB_ID"), ia);
}

TEST(Exports, DeepSpeedPrefixesThenEnvFile) {
  const EnvList environment = {{"PATH", "/bin"},
                               {"NCCL_DEBUG", "INFO "},
                               {"PYTHONPATH", "/p"},
                               {"UCX_TLS", "rc"},
                               {"MV2_X", "1"},
                               {"MLFLOW_URI", "u"},
                               {"DSCPP_KILL_GRACE_S", "2"},
                               {"HOME", "/h"},
                               {"NCCL_IB_HCA", "mlx5"}};
  EXPECT_EQ(collect_exports(environment, {{"NCCL_DEBUG", "WARN"}, {"FOO", "bar"}}),
            (EnvList{{"NCCL_DEBUG", "WARN"},
                     {"PYTHONPATH", "/p"},
                     {"UCX_TLS", "rc"},
                     {"MV2_X", "1"},
                     {"MLFLOW_URI", "u"},
                     {"DSCPP_KILL_GRACE_S", "2"},
                     {"NCCL_IB_HCA", "mlx5"},
                     {"FOO", "bar"}}));
}

TEST(Exports, AiscJobsKeepNodeLocalNetworkSettings) {
  const EnvList environment = {{"AISC_JOB_NAME", "j"},
                               {"NCCL_IB_HCA", "mlx5"},
                               {"UCX_NET_DEVICES", "d"},
                               {"NCCL_DEBUG", "INFO"}};
  EXPECT_EQ(collect_exports(environment, {}), (EnvList{{"NCCL_DEBUG", "INFO"}}));
}

}  // namespace
}  // namespace dscpp::launcher
