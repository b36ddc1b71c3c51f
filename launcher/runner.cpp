#include "runner.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "devices.h"
#include "environment.h"
#include "launch_plan.h"
#include "multinode_runner.h"
#include "node_launcher.h"
#include "output.h"
#include "port_reservation.h"
#include "process_group.h"
#include "python_program.h"
#include "world_info.h"

namespace dscpp::launcher {
namespace {

bool verbose(const Options& o) {
  return o.log_level == "debug" || o.log_level == "info";
}
bool warnings(const Options& o) {
  return verbose(o) || o.log_level == "warning";
}

std::string current_dir() {
  char buffer[PATH_MAX];
  if (::getcwd(buffer, sizeof(buffer)) == nullptr) return ".";
  return buffer;
}

std::string self_executable() {
  char buffer[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return "dscpp";
  return std::string(buffer, static_cast<size_t>(n));
}

std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + shell_quote(w);
  return out;
}

// Runs a short command before any rank exists (the ssh checks), capturing stdout.
int run_and_capture(const std::vector<std::string>& argv, const EnvList& env, std::string* out) {
  const auto path = find_executable(argv[0], get_env(env, "PATH").value_or(""));
  if (!path) return 127;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return 1;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    const int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 0);
    ::dup2(devnull, 2);
    ::execv(path->c_str(), args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof(buffer))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (out) out->append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> ssh_prefix(const Options& o) {
  std::vector<std::string> cmd = {"ssh"};
  if (o.ssh_port) cmd.insert(cmd.end(), {"-p", std::to_string(*o.ssh_port)});
  return cmd;
}

void check_ssh(const Options& o, const std::string& host, const EnvList& env) {
  auto cmd = ssh_prefix(o);
  cmd.insert(cmd.begin() + 1, {"-o", "PasswordAuthentication=no"});
  cmd.insert(cmd.end(), {host, "hostname"});
  if (run_and_capture(cmd, env, nullptr) != 0) {
    throw UserError(fmt::format(
        "Using hostfile at {} but host={} was not reachable via ssh. If you are running with a "
        "single node please remove {} or setup passwordless ssh (or pass --no_ssh_check).",
        o.hostfile, host, o.hostfile));
  }
}

std::string detect_master_addr(const Options& o, const std::string& host, const EnvList& env) {
  auto cmd = ssh_prefix(o);
  cmd.insert(cmd.end(), {host, "hostname", "-I"});
  std::string out;
  const int code = run_and_capture(cmd, env, &out);
  const size_t begin = out.find_first_not_of(" \t\r\n");
  if (code != 0 || begin == std::string::npos) {
    throw UserError(
        "Unable to detect suitable master address via 'hostname -I', please manually specify "
        "one via --master_addr");
  }
  return out.substr(begin, out.find_first_of(" \t\r\n", begin) - begin);
}

ChildSpec child_spec(const std::vector<std::string>& argv, const EnvList& env) {
  const auto path = find_executable(argv[0], get_env(env, "PATH").value_or(""));
  if (!path) throw UserError(fmt::format("cannot find '{}' in PATH", argv[0]));
  ChildSpec spec;
  spec.path = *path;
  spec.argv = argv;
  spec.envp = to_envp(env);
  return spec;
}

int run_multi_node(const Options& o, const LaunchPlan& plan, const EnvList& environment) {
  RunnerInputs in;
  in.launcher = o.launcher;
  in.active = plan.active;
  in.pool = plan.pool;
  in.hostfile = o.hostfile;
  in.world_info = encode_world_info(plan.active);
  in.master_addr = plan.master_addr;
  in.master_port = o.master_port;
  in.launcher_args = o.launcher_args;
  in.ssh_port = o.ssh_port;
  in.venv_script = o.venv_script;
  in.include = o.include;
  in.exclude = o.exclude;
  in.num_nodes = o.num_nodes;
  in.num_gpus = o.num_gpus;
  in.no_local_rank = o.no_local_rank;
  in.no_python = o.no_python;
  in.python = python_interpreter(environment);
  in.save_pid = o.save_pid;
  in.save_pid_owner = ::getpid();
  in.each_rank_log = o.each_rank_log;
  in.bind_cores_to_rank = o.bind_cores_to_rank;
  in.bind_core_list = o.bind_core_list;
  in.dscpp_path = self_executable();
  in.cwd = current_dir();
  in.program = o.program;
  in.program_args = o.program_args;
  validate_runner(in);

  const std::string probe = backend_probe_program(o.launcher);
  if (!find_executable(probe, get_env(environment, "PATH").value_or(""))) {
    throw UserError(
        fmt::format("launcher '{}' not installed ('{}' is not in PATH)", o.launcher, probe));
  }
  const std::string& first_host = plan.active.front().first;
  if (!o.no_ssh_check) check_ssh(o, first_host, environment);
  if (in.master_addr.empty()) {
    in.master_addr = detect_master_addr(o, first_host, environment);
    if (verbose(o)) say("dscpp: using {} of {} as master address\n", in.master_addr, first_host);
  }
  // As DeepSpeed's runner: the launch folder first on every node's PYTHONPATH (exported with
  // the other PYTHON* variables), so a Python program imports its neighbours there.
  EnvList exported = environment;
  const auto python_path = get_env(environment, "PYTHONPATH");
  set_env(exported, "PYTHONPATH", python_path ? in.cwd + ":" + *python_path : in.cwd);
  in.exports = collect_exports(exported, read_deepspeed_env(environment, in.cwd));

  std::vector<std::vector<std::string>> commands;
  EnvList env = environment;
  if (o.launcher == "pdsh") {
    commands.push_back(pdsh_command(in));
    for (const auto& [key, val] : pdsh_environment(in, environment)) set_env(env, key, val);
  } else if (o.launcher == "openmpi") {
    commands.push_back(openmpi_command(in));
  } else if (o.launcher == "mpich") {
    commands.push_back(mpich_command(in));
  } else if (o.launcher == "slurm") {
    commands.push_back(slurm_command(in));
  } else {
    commands = ssh_commands(in);
  }
  for (const auto& cmd : commands) {
    if (verbose(o)) say("dscpp: cmd = {}\n", join_words(cmd));
  }

  Supervisor supervisor(kill_grace_seconds(environment));
  supervisor.start();
  // Each ssh gets a pipe as stdin whose write end only we hold: the remote launcher sees
  // EOF when we close it at teardown or die, and the ssh clients do not share a terminal.
  std::vector<int> stdin_pipes;
  for (size_t i = 0; i < commands.size(); ++i) {
    ChildSpec spec = child_spec(commands[i], env);
    int fds[2] = {-1, -1};
    int err[2] = {-1, -1};
    if (o.launcher == "ssh") {
      if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
      spec.stdin_fd = fds[0];
      stdin_pipes.push_back(fds[1]);
    }
    if (o.launcher == "pdsh") {
      // pdsh waits for every host: a node whose rank failed shows only as a line on its
      // stderr, which is read here so that the other hosts are stopped at once.
      if (::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
      spec.stderr_fd = err[1];
    }
    supervisor.spawn_member(spec,
                            o.launcher == "ssh" ? "ssh to " + plan.active[i].first : o.launcher);
    if (fds[0] >= 0) ::close(fds[0]);
    if (err[1] >= 0) {
      ::close(err[1]);
      supervisor.watch_output(err[0], "pdsh", pdsh_failed_node);
    }
  }
  const ChildSpec kill_spec =
      o.launcher == "pdsh" ? child_spec(pdsh_kill_command(in), env) : ChildSpec{};
  supervisor.set_teardown_hook([&](bool) {
    for (int fd : stdin_pipes) ::close(fd);
    stdin_pipes.clear();
    // pdsh cannot stop what it started remotely, whether it was interrupted or one host
    // failed while the others run on; DeepSpeed runs pkill there (on interrupts only).
    if (!kill_spec.path.empty()) supervisor.spawn_helper(kill_spec);
  });
  const int code = supervisor.run();
  for (int fd : stdin_pipes) ::close(fd);
  return code;
}

}  // namespace

int run_runner(const Options& o) {
  if (o.module && warnings(o)) {
    say("dscpp: --module is Python-only and ignored; {} runs as a program\n", o.program);
  }
  EnvList environment = current_environment();
  // One id for every rank of this launch, on every host (collect_exports forwards DSCPP_*).
  // Launchers started one per node (--no_ssh) cannot agree on a fresh one: there the user's
  // DSCPP_JOB_ID, if any, is the job's.
  if (!o.no_ssh) ensure_job_id(environment);
  std::optional<ResourcePool> hostfile = read_hostfile(o.hostfile);
  if (!hostfile && o.hostfile_given) {
    throw UserError(fmt::format("hostfile {} does not exist", o.hostfile));
  }

  LocalMachine machine;
  machine.gpu_count = count_nvidia_gpus();
  machine.cpu_count = online_cpu_count();
  machine.cuda_visible_devices = get_env(environment, "CUDA_VISIBLE_DEVICES");
  machine.cpu_accelerator = get_env(environment, "DS_ACCELERATOR").value_or("") == "cpu";
  const LaunchPlan plan = resolve_launch(o, hostfile, machine);
  const double grace = kill_grace_seconds(environment);
  if (!plan.multi_node) {
    // Checked here as well as in run_node so that no notice precedes the error.
    NodeConfig program;
    program.program = o.program;
    program.no_python = o.no_python;
    program.python = python_interpreter(environment);
    find_program(program, environment);
  }
  for (const auto& notice : plan.notices) {
    if (warnings(o)) say("dscpp: {}\n", notice);
  }
  if (plan.multi_node) return run_multi_node(o, plan, environment);

  // --master_port 0: held until the ranks are gone (resolve_launch allowed it on one node only).
  std::optional<PortReservation> free_port;
  if (o.master_port == 0) {
    free_port.emplace();
    if (verbose(o)) say("dscpp: --master_port 0: using free port {}\n", free_port->port());
  }
  NodeRunOptions run;
  run.config.world = plan.active;
  run.config.node_rank = plan.node_rank;
  run.config.master_addr = plan.master_addr;
  run.config.master_port = free_port ? free_port->port() : o.master_port;
  run.config.program = o.program;
  run.config.program_args = o.program_args;
  run.config.no_local_rank = o.no_local_rank;
  run.config.hide_gpus = plan.hide_gpus;
  run.config.no_python = o.no_python;
  run.config.python = python_interpreter(environment);
  run.config.bind_cores_to_rank = o.bind_cores_to_rank;
  run.config.bind_core_list = o.bind_core_list;
  if (o.bind_cores_to_rank) run.config.default_cores = physical_core_list();
  run.config.extra_env = read_deepspeed_env(environment, current_dir());
  run.base_env = environment;
  run.each_rank_log = o.each_rank_log;
  run.save_pid = o.save_pid;
  run.save_pid_owner = o.save_pid_owner;
  run.grace_seconds = grace;
  return run_node(run);
}

int run_node_mode(const Options& o) {
  const EnvList environment = current_environment();
  NodeRunOptions run;
  run.config.world = decode_world_info(*o.world_info);
  run.config.node_rank = o.node_rank < 0 ? 0 : o.node_rank;
  run.config.master_addr = o.master_addr.empty() ? "127.0.0.1" : o.master_addr;
  run.config.master_port = o.master_port;
  run.config.program = o.program;
  run.config.program_args = o.program_args;
  run.config.no_local_rank = o.no_local_rank;
  run.config.no_python = o.no_python;
  run.config.python = python_interpreter(environment);
  run.config.bind_cores_to_rank = o.bind_cores_to_rank;
  run.config.bind_core_list = o.bind_core_list;
  if (o.bind_cores_to_rank) run.config.default_cores = physical_core_list();
  // The runner already exported .deepspeed_env on the command line.
  run.base_env = environment;
  run.each_rank_log = o.each_rank_log;
  run.save_pid = o.save_pid;
  run.save_pid_owner = o.save_pid_owner;
  run.exit_on_stdin_eof = o.exit_on_stdin_eof;
  run.grace_seconds = kill_grace_seconds(environment);
  return run_node(run);
}

}  // namespace dscpp::launcher
