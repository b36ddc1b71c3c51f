// Command-line options of `dscpp`, spelled as DeepSpeed's `deepspeed` runner spells them.
// Parsing stops at the first positional argument: that is the user program, and everything
// after it is passed to the program untouched, even tokens that look like dscpp flags.
// A --world_info value switches the binary into its internal per-node launcher mode (what a
// multi-node runner starts on each host). Usage errors throw UsageError, also for a
// --num_gpus or --num_nodes that is not a positive count.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "errors.h"

namespace dscpp::launcher {

class UsageError : public UserError {
 public:
  using UserError::UserError;
};

inline constexpr const char* kDefaultHostfile = "/job/hostfile";
inline constexpr int kDefaultMasterPort = 29500;
// Without GPUs every rank is a process on this machine's cores; past this many per core the
// request is a typo (--num_gpus 10000), not a job. The tests run 8 ranks on 2 cores.
inline constexpr int kMaxCpuRanksPerCore = 64;

struct Options {
  // Resource selection (runner mode).
  std::string hostfile = kDefaultHostfile;
  bool hostfile_given = false;
  std::string include;
  std::string exclude;
  int num_nodes = -1;
  int num_gpus = -1;
  // Start more CPU ranks than kMaxCpuRanksPerCore per core (OpenMPI's name for the same).
  bool oversubscribe = false;

  // Rendezvous.
  std::string master_addr;  // empty: 127.0.0.1 locally, detected over ssh for multi-node
  int master_port = kDefaultMasterPort;  // 0: one node only, a free port (port_reservation.h)
  int node_rank = -1;

  // Multi-node backends.
  std::string launcher = "pdsh";  // lower-cased
  std::string launcher_args;
  bool no_ssh = false;
  bool no_ssh_check = false;
  bool force_multi = false;
  std::optional<int> ssh_port;
  std::optional<std::string> venv_script;

  // Per-rank behaviour.
  bool no_local_rank = false;
  bool save_pid = false;
  int save_pid_owner = 0;     // internal: pid that names /tmp/<pid>.deepspeed; 0 = own pid
  std::string each_rank_log;  // empty: ranks write to the terminal
  bool bind_cores_to_rank = false;
  std::optional<std::string> bind_core_list;

  // Accepted for DeepSpeed compatibility; dscpp starts native programs directly.
  bool module = false;
  bool no_python = false;

  std::string log_level = "info";
  bool quiet = false;
  bool help = false;

  // Internal per-node launcher mode.
  std::optional<std::string> world_info;
  bool exit_on_stdin_eof = false;

  std::string program;
  std::vector<std::string> program_args;
};

// `args` excludes argv[0].
Options parse_options(const std::vector<std::string>& args);

std::string usage_text();

}  // namespace dscpp::launcher
