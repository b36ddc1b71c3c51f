// What one node's launcher starts: for every local slot, the global rank, the environment
// variables the rank gets and its argv. Pure, so the rank environment contract can be
// tested without starting processes. Ranks are numbered across hosts in world order; a
// node's CUDA_VISIBLE_DEVICES is its slot list, identical for all its local ranks, and
// LOCAL_RANK indexes into it (as with DeepSpeed's launch.py).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "environment.h"
#include "resources.h"

namespace dscpp::launcher {

struct NodeConfig {
  ActiveResources world;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string program;
  std::vector<std::string> program_args;
  bool no_local_rank = false;
  // The .py rule (python_program.h): a program ending in .py runs under `python`.
  bool no_python = false;
  std::string python = "python3";
  bool bind_cores_to_rank = false;
  std::optional<std::string> bind_core_list;
  std::vector<int> default_cores;  // used when binding without --bind_core_list
  EnvList extra_env;               // .deepspeed_env entries, applied before the rank variables
  bool hide_gpus = false;          // CPU ranks on a GPU machine: CUDA_VISIBLE_DEVICES is empty
};

struct RankLaunch {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> argv;  // argv[0] is the program as given
  EnvList env;                    // set on top of the launcher's environment
  std::vector<int> cpus;          // empty: keep the launcher's affinity
};

// Throws UserError when node_rank is out of range or the cores cannot be shared out.
std::vector<RankLaunch> plan_node(const NodeConfig& config);

}  // namespace dscpp::launcher
