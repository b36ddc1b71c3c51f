// The per-node launcher: starts this node's ranks as planned by plan_node and supervises
// them (see process_group.h) until they are all gone. It is what `dscpp` runs on a single
// node, for `--no_ssh --node_rank K`, and on every host of a pdsh/ssh multi-node job.
#pragma once

#include <string>

#include "environment.h"
#include "node_plan.h"

namespace dscpp::launcher {

struct NodeRunOptions {
  NodeConfig config;
  EnvList base_env;           // the launcher's environment; the ranks' starts from it
  std::string each_rank_log;  // directory, empty for none
  bool save_pid = false;
  int save_pid_owner = 0;  // names /tmp/<owner>.deepspeed; 0: this process
  bool exit_on_stdin_eof = false;
  double grace_seconds = 5.0;
};

// Returns the exit code for the launcher. Throws UserError for problems found before any
// rank starts (missing program, unusable log directory).
int run_node(const NodeRunOptions& options);

// DeepSpeed's per-rank log name: <dir>/<YYYYmmddHHMMSS>_rank<R>.log.
// The file the ranks exec: the program from PATH, or for a .py program (python_program.h) the
// interpreter, after checking that the script exists. Throws UserError naming what is missing.
std::string find_program(const NodeConfig& config, const EnvList& env);

std::string rank_log_path(const std::string& dir, const std::string& timestamp, int rank);

}  // namespace dscpp::launcher
