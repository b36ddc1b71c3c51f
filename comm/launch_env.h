// The launch contract: the only environment variables the library reads, all read here.
// The launcher (or mpirun) sets them for each rank; nothing else in dscpp calls getenv.
//   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE   the rank's place (dscpp's and torchrun's names)
//   OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}   OpenMPI's, used when RANK is unset,
//                                               as DeepSpeed maps them
//   MASTER_ADDR, MASTER_PORT                   where rank 0 serves the rendezvous store
//   GLOO_SOCKET_IFNAME                         the network interface Gloo uses (PyTorch's)
//   DEEPSPEED_TIMEOUT                          collective timeout in whole minutes (DeepSpeed's)
//   DSCPP_JOB_ID                               the launch's identity: ranks of another job that
//                                               reach our store are refused
// Malformed values throw CommError naming the variable, the value and what was expected.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace dscpp::comm {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::optional<std::string> gloo_socket_ifname;
  std::optional<std::chrono::minutes> timeout;  // DEEPSPEED_TIMEOUT
  std::string job_id;                           // empty: no launcher said which job this is
};

// Reads the variables above; with neither RANK nor OMPI_COMM_WORLD_RANK, a world of one.
DistEnv read_dist_env();

}  // namespace dscpp::comm
