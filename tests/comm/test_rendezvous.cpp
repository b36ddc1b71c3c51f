// read_dist_env: the launcher's variables, OpenMPI's as DeepSpeed maps them, and errors
// for an environment that cannot form a job.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dscpp/comm/rendezvous.h"

using dscpp::comm::CommError;
using dscpp::comm::read_dist_env;

namespace {
class Rendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"})
      unsetenv(v);
  }
};
}  // namespace

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
