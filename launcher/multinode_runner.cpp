#include "multinode_runner.h"

#include "python_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string_view>

namespace dscpp::launcher {
namespace {

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

std::vector<std::string> host_names(const ActiveResources& active) {
  std::vector<std::string> hosts;
  for (const auto& [host, slots] : active) hosts.push_back(host);
  return hosts;
}

std::vector<std::string> pool_hosts(const ResourcePool& pool) {
  std::vector<std::string> hosts;
  for (const auto& [host, slots] : pool) hosts.push_back(host);
  return hosts;
}

int pool_total(const ResourcePool& pool) {
  int total = 0;
  for (const auto& [host, slots] : pool) total += slots;
  return total;
}

// "export A=1; export B=2; " as DeepSpeed writes it, with values quoted for the shell.
std::string export_prefix(const EnvList& exports) {
  std::string out;
  for (const auto& [key, val] : exports)
    out += fmt::format("export {}={}; ", key, shell_quote(val));
  return out;
}

// What the remote shell runs after the exports and the cd.
std::vector<std::string> remote_launch(const RunnerInputs& in, const std::string& node_rank,
                                       bool watch_stdin) {
  std::vector<std::string> words = {shell_quote(in.dscpp_path)};
  for (const auto& flag : node_launcher_flags(in, node_rank)) words.push_back(shell_quote(flag));
  if (watch_stdin) words.push_back("--exit_on_stdin_eof");
  words.push_back(shell_quote(in.program));
  for (const auto& arg : in.program_args) words.push_back(shell_quote(arg));
  return words;
}

void require_unfiltered(const RunnerInputs& in) {
  if (!in.include.empty() || !in.exclude.empty()) {
    throw RunnerError(
        fmt::format("{} backend does not support worker include/exclusion", in.launcher));
  }
  if (in.num_nodes != -1 || in.num_gpus != -1) {
    throw RunnerError(
        fmt::format("{} backend does not support limiting num nodes/gpus", in.launcher));
  }
}

}  // namespace

bool is_known_launcher(const std::string& name) {
  return name == "pdsh" || name == "openmpi" || name == "mpich" || name == "slurm" || name == "ssh";
}

std::string backend_probe_program(const std::string& launcher) {
  if (launcher == "pdsh") return "pdsh";
  if (launcher == "openmpi") return "ompi_info";
  if (launcher == "mpich") return "mpirun";
  if (launcher == "slurm") return "sinfo";
  return "ssh";
}

void validate_active_resources(const std::string& launcher, const ActiveResources& active) {
  if (launcher != "slurm") return;
  // srun places tasks by count: it cannot pick device ids or vary the count per host.
  std::set<size_t> counts;
  for (const auto& [host, slots] : active) {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] != static_cast<int>(i)) {
        std::vector<std::string> ids;
        for (int s : slots) ids.push_back(std::to_string(s));
        throw RunnerError(fmt::format(
            "slurm backend cannot select specific device ids, got [{}] on {}. Filter whole "
            "hosts, or keep the first N slots on every host.",
            join(ids, ", "), host));
      }
    }
    counts.insert(slots.size());
  }
  if (counts.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [host, slots] : active)
      parts.push_back(fmt::format("{}: {}", host, slots.size()));
    throw RunnerError(fmt::format(
        "slurm backend needs the same slot count on every host, got {{{}}}", join(parts, ", ")));
  }
}

void validate_runner(const RunnerInputs& in) {
  if (!is_known_launcher(in.launcher)) {
    throw RunnerError(fmt::format(
        "unknown launcher '{}' (choose from pdsh, openmpi, mpich, slurm, ssh)", in.launcher));
  }
  if (in.launcher == "openmpi" || in.launcher == "mpich") require_unfiltered(in);
  if (in.launcher == "mpich") {
    for (const auto& [host, slots] : in.pool) {
      if (slots != in.pool.front().second) {
        throw RunnerError("MPICH requires same number of devices per node");
      }
    }
  }
  validate_active_resources(in.launcher, in.active);
}

Argv node_launcher_flags(const RunnerInputs& in, const std::string& node_rank) {
  Argv flags = {"--world_info=" + in.world_info, "--node_rank=" + node_rank,
                "--master_addr=" + in.master_addr, fmt::format("--master_port={}", in.master_port)};
  // DeepSpeed's PDSHRunner order (tests/launcher/compare_runners_with_deepspeed.py).
  if (in.no_python) flags.push_back("--no_python");
  if (in.no_local_rank) flags.push_back("--no_local_rank");
  if (in.save_pid) flags.push_back(fmt::format("--save_pid={}", in.save_pid_owner));
  if (!in.each_rank_log.empty()) flags.push_back("--enable_each_rank_log=" + in.each_rank_log);
  if (in.bind_cores_to_rank) flags.push_back("--bind_cores_to_rank");
  if (in.bind_core_list) flags.push_back("--bind_core_list=" + *in.bind_core_list);
  return flags;
}

Argv pdsh_command(const RunnerInputs& in) {
  Argv cmd = {
      "pdsh", "-S", "-f", std::to_string(kPdshMaxFanOut), "-w", join(host_names(in.active), ",")};
  for (auto& arg : shlex_split(in.launcher_args)) cmd.push_back(std::move(arg));
  // pdsh joins its remaining arguments with spaces for the remote shell, so every word
  // is quoted here; %n is replaced by pdsh with the host's index in the -w list.
  if (in.venv_script) cmd.push_back(fmt::format("source {};", shell_quote(*in.venv_script)));
  cmd.push_back(export_prefix(in.exports));
  cmd.push_back(fmt::format("cd {};", shell_quote(in.cwd)));
  for (auto& word : remote_launch(in, "%n", false)) cmd.push_back(std::move(word));
  return cmd;
}

Argv pdsh_kill_command(const RunnerInputs& in) {
  Argv cmd = {
      "pdsh", "-S", "-f", std::to_string(kPdshMaxFanOut), "-w", join(host_names(in.active), ",")};
  for (auto& arg : shlex_split(in.launcher_args)) cmd.push_back(std::move(arg));
  // "[-]" keeps the pattern from matching the command line of the shell that runs pkill.
  cmd.push_back("pkill");
  cmd.push_back("-f");
  cmd.push_back(shell_quote("[-]-world_info=" + in.world_info + " --node_rank="));
  return cmd;
}

EnvList pdsh_environment(const RunnerInputs& in, const EnvList& environment) {
  EnvList env;
  set_env(env, "PDSH_RCMD_TYPE", "ssh");
  if (in.ssh_port) {
    const std::string current = get_env(environment, "PDSH_SSH_ARGS_APPEND").value_or("");
    set_env(env, "PDSH_SSH_ARGS_APPEND",
            (current.empty() ? "" : current + " ") + fmt::format("-p {}", *in.ssh_port));
  }
  return env;
}

std::optional<int> pdsh_failed_node(const std::string& line) {
  static const std::string kMark = ": ssh exited with exit code ";
  if (line.rfind("pdsh@", 0) != 0) return std::nullopt;
  const size_t at = line.find(kMark);
  if (at == std::string::npos) return std::nullopt;
  const std::string digits = line.substr(at + kMark.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      digits.size() > 3)
    return std::nullopt;
  return std::stoi(digits);
}

Argv openmpi_command(const RunnerInputs& in) {
  std::vector<std::string> launcher_args = shlex_split(in.launcher_args);
  Argv cmd = {"mpirun",    "-n",        std::to_string(pool_total(in.pool)),
              "-hostfile", in.hostfile, "--mca",
              "btl",       "^openib"};
  // DeepSpeed pins TCP to eth0 unless the user chose an interface.
  bool user_if = false;
  for (size_t i = 0; i + 1 < launcher_args.size(); ++i) {
    if ((launcher_args[i] == "-mca" || launcher_args[i] == "--mca") &&
        launcher_args[i + 1] == "btl_tcp_if_include") {
      user_if = true;
    }
  }
  if (!user_if) cmd.insert(cmd.end(), {"--mca", "btl_tcp_if_include", "eth0"});
  cmd.insert(cmd.end(), launcher_args.begin(), launcher_args.end());

  EnvList exports = {{"UCX_TLS", "tcp"}};
  for (const auto& [key, val] : in.exports) set_env(exports, key, val);
  // Not in DeepSpeed, whose ranks find rank 0 over MPI; a dscpp rank has no MPI.
  set_env(exports, "MASTER_ADDR", in.master_addr);
  set_env(exports, "MASTER_PORT", std::to_string(in.master_port));
  for (const auto& [key, val] : exports) cmd.insert(cmd.end(), {"-x", key + "=" + val});
  // DeepSpeed's MPI runners: python_exec ([sys.executable, "-u"]) before a .py program.
  for (auto& word : program_prefix(in.program, in.no_python, in.python)) cmd.push_back(word);
  cmd.insert(cmd.end(), in.program_args.begin(), in.program_args.end());
  return cmd;
}

Argv mpich_command(const RunnerInputs& in) {
  const int per_node = in.pool.empty() ? 0 : in.pool.front().second;
  Argv cmd = {"mpirun", "-n", std::to_string(pool_total(in.pool)), "-ppn",
              std::to_string(per_node)};
  for (auto& arg : shlex_split(in.launcher_args)) cmd.push_back(std::move(arg));
  // Hydra's -genv takes the name and the value as two arguments.
  for (const auto& [key, val] : in.exports) cmd.insert(cmd.end(), {"-genv", key, val});
  cmd.insert(cmd.end(), {"-genv", "MASTER_ADDR", in.master_addr});
  cmd.insert(cmd.end(), {"-genv", "MASTER_PORT", std::to_string(in.master_port)});
  cmd.insert(cmd.end(), {"-genv", "WORLD_SIZE", std::to_string(pool_total(in.pool))});
  cmd.insert(cmd.end(), {"-genv", "LOCAL_SIZE", std::to_string(per_node)});
  cmd.insert(cmd.end(), {"-hosts", join(pool_hosts(in.pool), ",")});
  // DeepSpeed's MPI runners: python_exec ([sys.executable, "-u"]) before a .py program.
  for (auto& word : program_prefix(in.program, in.no_python, in.python)) cmd.push_back(word);
  cmd.insert(cmd.end(), in.program_args.begin(), in.program_args.end());
  return cmd;
}

Argv slurm_command(const RunnerInputs& in) {
  int total = 0;
  for (const auto& [host, slots] : in.active) total += static_cast<int>(slots.size());
  Argv cmd = {"srun", "-n", std::to_string(total)};
  for (auto& arg : shlex_split(in.launcher_args)) cmd.push_back(std::move(arg));
  if (!in.include.empty() || !in.exclude.empty()) {
    // srun has no --include; name the hosts that survived the filter, and all of them.
    cmd.insert(cmd.end(), {"--nodelist", join(host_names(in.active), ","), "--nodes",
                           std::to_string(in.active.size())});
  }
  if (in.num_nodes > 0) cmd.insert(cmd.end(), {"--nodes", std::to_string(in.num_nodes)});
  if (in.num_gpus > 0) cmd.insert(cmd.end(), {"--gpus-per-node", std::to_string(in.num_gpus)});
  std::string exports = "--export=ALL";
  for (const auto& [key, val] : in.exports) exports += "," + key + "=" + val;
  // As for openmpi: the rank's runtime needs the rendezvous point without MPI.
  exports += ",MASTER_ADDR=" + in.master_addr + fmt::format(",MASTER_PORT={}", in.master_port);
  cmd.push_back(exports);
  // DeepSpeed's MPI runners: python_exec ([sys.executable, "-u"]) before a .py program.
  for (auto& word : program_prefix(in.program, in.no_python, in.python)) cmd.push_back(word);
  cmd.insert(cmd.end(), in.program_args.begin(), in.program_args.end());
  return cmd;
}

std::vector<Argv> ssh_commands(const RunnerInputs& in) {
  const std::vector<std::string> launcher_args = shlex_split(in.launcher_args);
  std::vector<Argv> cmds;
  for (size_t node = 0; node < in.active.size(); ++node) {
    Argv cmd = {"ssh"};
    if (in.ssh_port) cmd.insert(cmd.end(), {"-p", std::to_string(*in.ssh_port)});
    cmd.insert(cmd.end(), launcher_args.begin(), launcher_args.end());
    cmd.push_back(in.active[node].first);
    std::string remote;
    if (in.venv_script) remote += fmt::format("source {}; ", shell_quote(*in.venv_script));
    remote += export_prefix(in.exports);
    remote += fmt::format("cd {}; ", shell_quote(in.cwd));
    remote += join(remote_launch(in, std::to_string(node), true), " ");
    cmd.push_back(remote);
    cmds.push_back(std::move(cmd));
  }
  return cmds;
}

std::vector<std::string> shlex_split(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
      ++i;
    } else if (c == '\'') {
      const size_t end = text.find('\'', i + 1);
      if (end == std::string::npos) throw RunnerError("--launcher_args: no closing quotation");
      word += text.substr(i + 1, end - i - 1);
      in_word = true;
      i = end + 1;
    } else if (c == '"') {
      in_word = true;
      ++i;
      while (true) {
        if (i >= text.size()) throw RunnerError("--launcher_args: no closing quotation");
        if (text[i] == '"') break;
        // Inside double quotes a backslash only escapes these, as in the POSIX shell.
        if (text[i] == '\\' && i + 1 < text.size() &&
            (text[i + 1] == '"' || text[i + 1] == '\\' || text[i + 1] == '$' ||
             text[i + 1] == '`')) {
          ++i;
        }
        word += text[i++];
      }
      ++i;
    } else if (c == '\\') {
      if (i + 1 >= text.size()) throw RunnerError("--launcher_args: no escaped character");
      word += text[i + 1];
      in_word = true;
      i += 2;
    } else {
      word += c;
      in_word = true;
      ++i;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

std::string shell_quote(const std::string& word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](unsigned char c) {
    return std::isalnum(c) ||
           std::string_view("_@%+=:,./-").find(static_cast<char>(c)) != std::string_view::npos;
  });
  if (safe) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace dscpp::launcher
