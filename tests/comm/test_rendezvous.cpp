// read_dist_env: the launcher's variables, OpenMPI's as DeepSpeed maps them, and errors
// for an environment that cannot form a job.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "dscpp/comm/rendezvous.h"

using dscpp::comm::CommError;
using dscpp::comm::InitOptions;
using dscpp::comm::read_dist_env;
using dscpp::comm::resolve_timeout;

namespace {
std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const dscpp::Error& e) {  // CommError is one of the library's errors
    return e.what();
  }
  return "";
}
}  // namespace

// The fixture and its tests in one anonymous namespace: a test class derived from a fixture of
// this file alone is of this file too (g++'s -Wsubobject-linkage, where a unity build includes it).
namespace {
class Rendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE", "GLOO_SOCKET_IFNAME", "DEEPSPEED_TIMEOUT", "DSCPP_JOB_ID"})
      unsetenv(v);
  }
};

TEST_F(Rendezvous, NoEnvironmentIsAWorldOfOne) {
  auto e = read_dist_env();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
}

TEST_F(Rendezvous, LauncherVariables) {
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "1234", 1);
  auto e = read_dist_env();
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 4);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 1234);
}

TEST_F(Rendezvous, OpenMpiVariablesAsDeepSpeedMapsThem) {
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  setenv("MASTER_ADDR", "host0", 1);
  auto e = read_dist_env();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_port, 29500);
}

TEST_F(Rendezvous, InconsistentEnvironmentsAreErrors) {
  setenv("RANK", "1", 1);
  EXPECT_THROW(read_dist_env(), CommError);  // no WORLD_SIZE
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_THROW(read_dist_env(), CommError);  // no MASTER_ADDR for a world of two
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("RANK", "2", 1);
  EXPECT_THROW(read_dist_env(), CommError);  // rank outside the world
  setenv("RANK", "x", 1);
  EXPECT_THROW(read_dist_env(), CommError);
}

TEST_F(Rendezvous, DeepSpeedTimeoutIsMinutesAndTheApiArgumentWins) {
  InitOptions options;
  // DeepSpeed 0.19's default_pg_timeout: 10 minutes.
  EXPECT_EQ(resolve_timeout(options, read_dist_env()), std::chrono::minutes(10));
  setenv("DEEPSPEED_TIMEOUT", "3", 1);
  auto e = read_dist_env();
  ASSERT_TRUE(e.timeout.has_value());
  EXPECT_EQ(resolve_timeout(options, e), std::chrono::milliseconds(180000));
  options.timeout = std::chrono::seconds(20);  // init_distributed(timeout=...)
  EXPECT_EQ(resolve_timeout(options, e), std::chrono::milliseconds(20000));
  options.timeout = std::chrono::seconds(0);
  EXPECT_THROW(resolve_timeout(options, e), CommError);
}

TEST_F(Rendezvous, BadTimeoutsNameTheVariable) {
  for (const char* bad : {"0", "-1", "1.5", "ten", "99999999999999999999"}) {
    setenv("DEEPSPEED_TIMEOUT", bad, 1);
    std::string what = error_of([] { read_dist_env(); });
    EXPECT_NE(what.find("DEEPSPEED_TIMEOUT='" + std::string(bad) +
                        "': expected a timeout in whole minutes"),
              std::string::npos)
        << what;
  }
}

TEST_F(Rendezvous, JobIdInterfaceAndPort) {
  setenv("DSCPP_JOB_ID", "job-42", 1);
  setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  auto e = read_dist_env();
  EXPECT_EQ(e.job_id, "job-42");
  EXPECT_EQ(e.gloo_socket_ifname.value_or(""), "lo");
  setenv("MASTER_PORT", "70000", 1);
  EXPECT_NE(error_of([] { read_dist_env(); }).find("MASTER_PORT='70000': expected a TCP port"),
            std::string::npos);
}

// A port another process listens on: rank 0 cannot serve the store there, and the error says
// so in words, without LibTorch's C++ backtrace (c10::Error's what() carries one).
TEST_F(Rendezvous, ATakenPortIsAnErrorWithoutABacktrace) {
  const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(taken, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port.c_str(), 1);
  InitOptions o;
  o.backend = "gloo";
  o.timeout = std::chrono::seconds(5);  // only if the store were served after all
  std::string e;
  try {
    dscpp::comm::init_distributed(o);
  } catch (const CommError& error) {
    e = error.what();
  }
  ::close(taken);
  EXPECT_NE(e.find("rank 0 of 2 could not serve the store on port " + port), std::string::npos)
      << e;
  EXPECT_EQ(e.find("Exception raised from"), std::string::npos) << e;
  EXPECT_EQ(e.find("frame #"), std::string::npos) << e;
}

}  // namespace
