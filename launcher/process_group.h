// Starts processes (ranks, or a multi-node backend such as pdsh) and supervises them until
// none is left, DeepSpeed-launch style: the first one to fail (non-zero exit or a signal)
// makes the supervisor SIGTERM every other one, SIGKILL whatever is still there after a
// grace period, and report the failure's exit code (128+S for signal S). SIGINT, SIGTERM
// and SIGHUP sent to the launcher are forwarded to every process, followed by the same
// teardown.
//
// Nothing may outlive the launcher:
//  - each process leads its own process group and signals go to the whole group, which
//    reaches grandchildren;
//  - the launcher is a child subreaper, so descendants that left their group and lost
//    their parent are re-parented to it, found in /proc and stopped too, and run() returns
//    only when the launcher has no child left at all;
//  - children get PR_SET_PDEATHSIG=SIGKILL, and a small guardian process kills every group
//    if the launcher itself dies without cleaning up (kill -9).
//
// Single-threaded by design: children are forked and exec'd immediately, and signals are
// read from a signalfd in a poll() loop, so no work happens in signal handlers.
#pragma once

#include <sys/types.h>

#include <signal.h>
#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "environment.h"

namespace dscpp::launcher {

struct ChildSpec {
  std::string path;  // executable to run (see find_executable)
  std::vector<std::string> argv;
  std::vector<std::string> envp;  // complete environment, NAME=VALUE
  int stdin_fd = -1;              // -1: inherit
  int output_fd = -1;             // stdout and stderr; -1: inherit
  int stderr_fd = -1;             // stderr alone (after output_fd); -1: as above
  std::vector<int> cpus;          // CPU affinity; empty: inherit
};

// execvp's search: `name` containing '/' is used as is, otherwise looked up in `path_env`.
// Returns nullopt when nothing executable is found.
std::optional<std::string> find_executable(const std::string& name, const std::string& path_env);

// DSCPP_KILL_GRACE_S (seconds, default 5). Throws UserError for a bad value.
double kill_grace_seconds(const EnvList& environment);

class Supervisor {
 public:
  explicit Supervisor(double grace_seconds);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Must run before the first spawn: blocks the handled signals, starts the guardian and
  // becomes a subreaper.
  void start();

  // A member's failure tears the job down; `label` names it in messages ("rank 3").
  pid_t spawn_member(const ChildSpec& spec, const std::string& label);
  // A helper (such as pdsh's remote kill command) is left alone by SIGTERM and only killed
  // if still running when the grace period ends.
  pid_t spawn_helper(const ChildSpec& spec);

  // A member's stderr read through a pipe: fd is the pipe's read end (the supervisor owns
  // it). What arrives is copied to this process's stderr unchanged; each complete line is
  // passed to on_line, and a line for which it returns an exit code fails the job as that
  // member's non-zero exit would (pdsh reports a remote command's failure only as a line,
  // and keeps waiting for the other hosts).
  using LineWatch = std::function<std::optional<int>(const std::string& line)>;
  void watch_output(int fd, const std::string& label, LineWatch on_line);

  // For a launcher started over ssh: EOF on stdin means the runner is gone.
  void watch_stdin_for_eof() { watch_stdin_ = true; }
  // Called once when teardown begins; `by_signal` is true when the launcher was signalled
  // or lost its runner, false when a member failed.
  void set_teardown_hook(std::function<void(bool by_signal)> hook) { hook_ = std::move(hook); }

  // Supervises until no child is left. Returns the job's exit code.
  int run();

  std::vector<pid_t> member_pids() const;

 private:
  enum class State { kRunning, kTerminating, kKilling };
  struct Member {
    pid_t pid;
    std::string label;
    bool alive = true;
    std::string ended;  // how it ended ("exited with code 0"), once it has
  };
  using Clock = std::chrono::steady_clock;

  pid_t fork_exec(const ChildSpec& spec);
  void start_guardian();
  bool reap();
  void on_exit(pid_t pid, int status);
  void on_signal(int signo);
  void on_stdin();
  void on_output(size_t watch);
  void begin_teardown(bool by_signal);
  void escalate();
  void signal_stragglers();
  int poll_timeout_ms() const;

  double grace_seconds_;
  State state_ = State::kRunning;
  int exit_code_ = 0;
  bool exit_code_set_ = false;
  std::vector<Member> members_;
  int alive_members_ = 0;
  std::set<pid_t> helpers_;
  std::set<pid_t> sent_term_;
  Clock::time_point deadline_{};
  int signal_fd_ = -1;
  int guardian_fd_ = -1;
  bool started_ = false;
  bool watch_stdin_ = false;
  struct OutputWatch {
    int fd;
    std::string label;
    LineWatch on_line;
    std::string pending;  // the part of a line read so far
  };
  std::vector<OutputWatch> watches_;
  bool teardown_hook_called_ = false;
  std::function<void(bool)> hook_;
  sigset_t original_mask_{};
};

}  // namespace dscpp::launcher
