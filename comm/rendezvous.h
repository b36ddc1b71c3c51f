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
//
// Called again in the same process (a second engine, an evaluation, a restart in the same
// program), it returns the world it joined before, as DeepSpeed's init_distributed keeps
// torch.distributed's default group: no second store, no second rendezvous. It must then be
// compatible: the same rank, world size, MASTER_ADDR:MASTER_PORT and job id in the
// environment, and where the options name them, the same backend, timeout and NCCL device;
// otherwise a CommError names what differs. The world lives until destroy_process_group().
std::shared_ptr<ProcessGroup> init_distributed(const InitOptions& options = {});

// Whether this process holds a world from init_distributed (torch.distributed.is_initialized).
bool is_initialized();

// Lets go of the process's world (torch.distributed.destroy_process_group): the group itself
// goes when its last user (an engine) does, and the next init_distributed joins the job anew.
// Collective in effect: every rank must do it before any rank joins again.
void destroy_process_group();

}  // namespace dscpp::comm
