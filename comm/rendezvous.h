// How a rank finds the others: the environment the launcher (or mpirun) set, a TCPStore
// served by rank 0 at MASTER_ADDR:MASTER_PORT, and the world ProcessGroup on top of it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "dscpp/comm/process_group.h"

namespace dscpp::comm {

// The rank's place in the job. From RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE, MASTER_ADDR,
// MASTER_PORT; without RANK, from OpenMPI's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,
// LOCAL_SIZE} as DeepSpeed maps them; with neither, a world of one.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};
DistEnv read_dist_env();

struct InitOptions {
  std::string backend =
      "auto";  // "gloo", "nccl", or "auto": NCCL when built with CUDA and a GPU is visible
  // DeepSpeed's default: a collective that has not completed after this fails.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  int device_index = -1;  // NCCL's device; -1: LOCAL_RANK
};

// Joins the job and returns the world group (named "world"). Throws CommError.
std::shared_ptr<ProcessGroup> init_distributed(const InitOptions& options = {});

}  // namespace dscpp::comm
