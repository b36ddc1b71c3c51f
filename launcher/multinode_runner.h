// Command lines that start a job on several hosts, one pure function per backend so tests
// can compare exact argv. Shapes follow DeepSpeed's multinode_runner.py: pdsh and ssh start
// one per-node `dscpp --world_info=... --node_rank=K` on every host, which then starts that
// host's ranks; openmpi, mpich and slurm start every rank of the user program themselves,
// and the rank's runtime reads its rank from OMPI_*/PMI_*/SLURM_* variables.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "environment.h"
#include "errors.h"
#include "hostfile.h"
#include "resources.h"

namespace dscpp::launcher {

using Argv = std::vector<std::string>;

class RunnerError : public UserError {
 public:
  using UserError::UserError;
};

struct RunnerInputs {
  std::string launcher;  // pdsh | openmpi | mpich | slurm | ssh
  ActiveResources active;
  ResourcePool pool;  // the hostfile as written; openmpi and mpich size the job from it
  std::string hostfile;
  std::string world_info;  // encode_world_info(active)
  std::string master_addr;
  int master_port = 29500;
  std::string launcher_args;
  std::optional<int> ssh_port;
  std::optional<std::string> venv_script;
  // The filters as given, which some backends must reject or translate.
  std::string include;
  std::string exclude;
  int num_nodes = -1;
  int num_gpus = -1;
  // Forwarded to every per-node launcher.
  bool no_local_rank = false;
  bool no_python = false;          // forwarded; the MPI runners apply the .py rule themselves
  std::string python = "python3";  // the MPI runners' interpreter for a .py program
  bool save_pid = false;
  int save_pid_owner = 0;
  std::string each_rank_log;
  bool bind_cores_to_rank = false;
  std::optional<std::string> bind_core_list;
  // Where and what to run.
  std::string dscpp_path;  // this binary, assumed installed at the same path on every host
  std::string cwd;
  std::string program;
  std::vector<std::string> program_args;
  EnvList exports;
};

inline constexpr int kPdshMaxFanOut = 1024;

// Backend names dscpp supports, and the program whose presence shows the backend exists.
bool is_known_launcher(const std::string& name);
std::string backend_probe_program(const std::string& launcher);

// Throws RunnerError when the backend cannot express the request (DeepSpeed's
// validate_args / validate_active_resources).
void validate_runner(const RunnerInputs& in);
// Only the active-resource part; DeepSpeed checks it before choosing local or multi-node.
void validate_active_resources(const std::string& launcher, const ActiveResources& active);

// The flags of the per-node launcher, after `dscpp`. node_rank is "%n" for pdsh.
Argv node_launcher_flags(const RunnerInputs& in, const std::string& node_rank);

Argv pdsh_command(const RunnerInputs& in);
// Run on teardown: pdsh alone cannot stop remote processes once its connections are gone.
Argv pdsh_kill_command(const RunnerInputs& in);
// Variables pdsh itself needs (PDSH_RCMD_TYPE, PDSH_SSH_ARGS_APPEND).
EnvList pdsh_environment(const RunnerInputs& in, const EnvList& environment);

// The exit code in pdsh's report of a remote command that failed ("pdsh@h: node2: ssh exited
// with exit code 3"); nullopt for any other line.
std::optional<int> pdsh_failed_node(const std::string& stderr_line);

Argv openmpi_command(const RunnerInputs& in);
Argv mpich_command(const RunnerInputs& in);
Argv slurm_command(const RunnerInputs& in);
// One ssh per host, in host order. The remote launcher watches its stdin, so closing the
// local end (or the ssh client dying) tears that host's ranks down.
std::vector<Argv> ssh_commands(const RunnerInputs& in);

// POSIX shell word splitting as Python's shlex.split does it. Throws RunnerError on
// unbalanced quotes.
std::vector<std::string> shlex_split(const std::string& text);
// Leaves words of safe characters alone and single-quotes everything else.
std::string shell_quote(const std::string& word);

}  // namespace dscpp::launcher
