// How a rank finds the others: the environment the launcher (or mpirun) set (read in
// launch_env.h), a TCPStore
// served by rank 0 at MASTER_ADDR:MASTER_PORT, and the world ProcessGroup on top of it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "dscpp/comm/launch_env.h"
#include "dscpp/comm/process_group.h"

namespace dscpp::comm {

struct InitOptions {
  std::string backend =
      "auto";  // "gloo", "nccl", or "auto": NCCL when built with CUDA and a GPU is visible
  // A collective that has not completed after this fails (init_distributed(timeout=...)).
  // Unset: DEEPSPEED_TIMEOUT minutes, else DeepSpeed's default_pg_timeout.
  std::optional<std::chrono::milliseconds> timeout;
  int device_index = -1;  // NCCL's device; -1: LOCAL_RANK
};

// DeepSpeed's default_pg_timeout (deepspeed/constants.py, 0.19): 10 minutes.
inline constexpr std::chrono::minutes kDefaultTimeout{10};

// The timeout a group gets: the explicit one, else DEEPSPEED_TIMEOUT, else the default.
std::chrono::milliseconds resolve_timeout(const InitOptions& options, const DistEnv& env);

// Joins the job and returns the world group (named "world"). Throws CommError, also when a
// rank of another job (another DSCPP_JOB_ID) reached this job's store: two jobs on one
// MASTER_PORT never form one world.
std::shared_ptr<ProcessGroup> init_distributed(const InitOptions& options = {});

}  // namespace dscpp::comm
