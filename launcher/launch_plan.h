// Decides what a user-facing `dscpp` invocation runs, from its options, the hostfile and
// what this machine has, following DeepSpeed's runner.main(): the resource pool (hostfile,
// or local devices), CUDA_VISIBLE_DEVICES, the filters, and whether this process starts the
// ranks itself or hands the job to a multi-node backend. Pure, so every rule is testable.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hostfile.h"
#include "options.h"
#include "resources.h"

namespace dscpp::launcher {

struct LocalMachine {
  int gpu_count = 0;
  int cpu_count = 1;
  std::optional<std::string> cuda_visible_devices;
  // DS_ACCELERATOR=cpu, DeepSpeed's way to ask for CPU ranks: the GPUs are left alone.
  bool cpu_accelerator = false;
};

struct LaunchPlan {
  ResourcePool pool;                 // what the filters were applied to
  ActiveResources active;            // rank order
  bool multi_node = false;           // true: start a backend (pdsh, ...) instead of local ranks
  int node_rank = 0;                 // the node this process runs when !multi_node
  std::string master_addr;           // empty only for multi-node runs that must detect it
  std::vector<std::string> notices;  // informational lines for the user
  bool hide_gpus = false;            // CPU ranks on a machine with GPUs: ranks see none
};

// Throws UserError for contradictory or unsatisfiable requests.
LaunchPlan resolve_launch(const Options& options, const std::optional<ResourcePool>& hostfile,
                          const LocalMachine& machine);

}  // namespace dscpp::launcher
