#include "node_launcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "errors.h"
#include "master_addr.h"
#include "output.h"
#include "pid_files.h"
#include "process_group.h"
#include "python_program.h"

namespace dscpp::launcher {
namespace {

void make_directories(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      throw UserError(fmt::format("--enable_each_rank_log: {} is a file, not a directory", dir));
    }
    return;
  }
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_directories(dir.substr(0, slash));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw UserError(
        fmt::format("--enable_each_rank_log: cannot create {}: {}", dir, std::strerror(errno)));
  }
}

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

std::string find_program(const NodeConfig& config, const EnvList& env) {
  const std::string search = get_env(env, "PATH").value_or("");
  if (runs_with_python(config.program, config.no_python)) {
    if (::access(config.program.c_str(), R_OK) != 0)
      throw UserError(fmt::format("cannot find the Python program '{}'", config.program));
    const auto python = find_executable(config.python, search);
    if (!python)
      throw UserError(fmt::format(
          "cannot find the Python interpreter '{}' to run {} (set DSCPP_PYTHON, or give "
          "--no_python to run the program directly)",
          config.python, config.program));
    return *python;
  }
  const auto path = find_executable(config.program, search);
  if (!path) throw UserError(fmt::format("cannot find an executable program '{}'", config.program));
  return *path;
}

std::string rank_log_path(const std::string& dir, const std::string& timestamp, int rank) {
  return fmt::format("{}/{}_rank{}.log", dir, timestamp, rank);
}

int run_node(const NodeRunOptions& options) {
  const std::vector<RankLaunch> ranks = plan_node(options.config);
  const std::string program = options.config.program;
  const auto path = find_program(options.config, options.base_env);
  // Before anything starts: an address that names no host would otherwise fail only when the
  // ranks' rendezvous gives up (twice the collective timeout later).
  check_master_addr(options.config.master_addr);
  // What launchers killed with SIGKILL left behind.
  remove_stale_pid_files(kPidFileDir);

  std::string timestamp;
  if (!options.each_rank_log.empty()) {
    make_directories(options.each_rank_log);
    char buffer[32];
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    ::localtime_r(&now, &local);
    std::strftime(buffer, sizeof(buffer), "%Y%m%d%H%M%S", &local);
    timestamp = buffer;
  }

  std::string pid_file;
  if (options.save_pid) {
    const int owner = options.save_pid_owner > 0 ? options.save_pid_owner : ::getpid();
    pid_file = pid_file_path(kPidFileDir, owner);
    say_out("launcher pid: {}\n", ::getpid());
    write_file_atomically(pid_file, std::to_string(::getpid()));
  }

  int devnull = -1;
  // With --exit_on_stdin_eof, stdin belongs to the supervisor's EOF watch. A terminal is
  // withheld too: ranks lead their own process groups, so reading the terminal would stop
  // them (SIGTTIN) and hang the job instead of reading end-of-file.
  if (options.exit_on_stdin_eof || ::isatty(0)) devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  FdCloser close_devnull(devnull);

  Supervisor supervisor(options.grace_seconds);
  supervisor.start();
  if (options.exit_on_stdin_eof) supervisor.watch_stdin_for_eof();
  for (const RankLaunch& rank : ranks) {
    EnvList env = options.base_env;
    for (const auto& [key, val] : rank.env) set_env(env, key, val);
    ChildSpec spec;
    spec.path = path;
    spec.argv = rank.argv;
    spec.envp = to_envp(env);
    spec.cpus = rank.cpus;
    spec.stdin_fd = devnull;
    int log_fd = -1;
    if (!timestamp.empty()) {
      const std::string log = rank_log_path(options.each_rank_log, timestamp, rank.rank);
      log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (log_fd < 0) {
        throw UserError(fmt::format("cannot create rank log {}: {}", log, std::strerror(errno)));
      }
    }
    FdCloser close_log(log_fd);
    spec.output_fd = log_fd;
    supervisor.spawn_member(spec, fmt::format("rank {}", rank.rank));
  }

  if (!pid_file.empty()) {
    std::string pids;
    for (pid_t pid : supervisor.member_pids()) pids += std::to_string(pid) + "\n";
    write_file_atomically(pid_file + ".ranks", pids);
  }

  const int code = supervisor.run();
  if (!pid_file.empty()) {
    std::remove(pid_file.c_str());
    std::remove((pid_file + ".ranks").c_str());
  }
  return code;
}

}  // namespace dscpp::launcher
