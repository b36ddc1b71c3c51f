#include "process_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "errors.h"
#include "output.h"

namespace dscpp::launcher {
namespace {

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  }
  return fmt::format("exited with code {}", exit_code_of(status));
}

struct ProcEntry {
  pid_t pid;
  pid_t pgid;
};

// Direct children of this process, found through /proc because adopted orphans were never
// spawned by us and their pids are otherwise unknown until they die.
std::vector<ProcEntry> list_children() {
  std::vector<ProcEntry> children;
  const pid_t self = ::getpid();
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return children;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    if (!std::getline(in, stat)) continue;
    // The command name may contain spaces and parentheses; the fields start after the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    char state = 0;
    long ppid = 0, pgid = 0;
    if (!(fields >> state >> ppid >> pgid)) continue;
    if (ppid == self) children.push_back({static_cast<pid_t>(pid), static_cast<pid_t>(pgid)});
  }
  ::closedir(proc);
  return children;
}

void close_fds_from(int first) {
  if (::syscall(SYS_close_range, first, ~0U, 0) == 0) return;
  const long max_fd = ::sysconf(_SC_OPEN_MAX);
  for (long fd = first; fd < (max_fd > 0 ? max_fd : 65536); ++fd) ::close(static_cast<int>(fd));
}

// Runs in a detached process: collects the process groups the launcher announces and, if
// the launcher disappears without saying goodbye, kills them all.
[[noreturn]] void guardian_main(int sock) {
  ::setsid();
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  // Holding the launcher's stdout or a caller's pipe open would keep readers waiting.
  const int keep = ::fcntl(sock, F_DUPFD, 3);
  const int devnull = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(devnull, fd);
  ::dup2(keep, 3);
  close_fds_from(4);

  std::vector<pid_t> groups;
  int32_t value = 0;
  size_t have = 0;
  while (true) {
    ssize_t n = ::read(3, reinterpret_cast<char*>(&value) + have, sizeof(value) - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
    if (have < sizeof(value)) continue;
    have = 0;
    if (value == 0) ::_exit(0);  // orderly shutdown: everything is already gone
    groups.push_back(value);
  }
  for (pid_t group : groups) ::kill(-group, SIGKILL);
  ::_exit(0);
}

}  // namespace

std::optional<std::string> find_executable(const std::string& name, const std::string& path_env) {
  auto executable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
  };
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    return executable(name) ? std::optional<std::string>(name) : std::nullopt;
  }
  const std::string search = path_env.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_env;
  size_t start = 0;
  while (start <= search.size()) {
    size_t colon = search.find(':', start);
    std::string dir =
        search.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    if (executable(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return std::nullopt;
}

double kill_grace_seconds(const EnvList& environment) {
  const auto value = get_env(environment, "DSCPP_KILL_GRACE_S");
  if (!value || value->empty()) return 5.0;
  char* end = nullptr;
  const double seconds = std::strtod(value->c_str(), &end);
  if (*end != '\0' || !std::isfinite(seconds) || seconds < 0) {
    throw UserError(fmt::format("DSCPP_KILL_GRACE_S='{}' is not a number of seconds", *value));
  }
  return seconds;
}

Supervisor::Supervisor(double grace_seconds) : grace_seconds_(grace_seconds) {}

Supervisor::~Supervisor() {
  if (started_ && alive_members_ > 0) {
    // run() never happened (an exception between spawns): leave nothing behind.
    for (const Member& m : members_) ::kill(-m.pid, SIGKILL);
    for (const Member& m : members_) {
      if (m.alive) ::waitpid(m.pid, nullptr, 0);
    }
  }
  if (signal_fd_ >= 0) ::close(signal_fd_);
  if (guardian_fd_ >= 0) ::close(guardian_fd_);
  // The signal mask stays as it is: unblocking now would let a signal that arrived after
  // the last poll kill the launcher before it returns the job's exit code.
}

void Supervisor::start() {
  sigset_t handled;
  sigemptyset(&handled);
  for (int signo : kHandledSignals) sigaddset(&handled, signo);
  if (::sigprocmask(SIG_BLOCK, &handled, &original_mask_) != 0) throw_errno("sigprocmask");
  started_ = true;
  // Messages written during teardown must not kill the launcher when its stderr is a
  // pipe whose reader has gone (a dropped ssh connection, `dscpp ... | head`); main ignores
  // it from the start, this is for any other user of the Supervisor.
  ignore_sigpipe();
  signal_fd_ = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) throw_errno("signalfd");
  // The guardian must be started before becoming a subreaper, or it would be adopted by us.
  start_guardian();
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) throw_errno("prctl(PR_SET_CHILD_SUBREAPER)");
}

void Supervisor::start_guardian() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw_errno("socketpair");
  const pid_t middle = ::fork();
  if (middle < 0) throw_errno("fork");
  if (middle == 0) {
    // Double fork so the guardian is nobody's child here and outlives us.
    ::close(fds[0]);
    if (::fork() == 0) guardian_main(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  ::waitpid(middle, nullptr, 0);
  guardian_fd_ = fds[0];
}

pid_t Supervisor::fork_exec(const ChildSpec& spec) {
  if (!started_) throw std::logic_error("Supervisor::start() must run before spawning");
  // Everything the child needs is prepared here; between fork and exec it only makes
  // system calls.
  std::vector<char*> argv;
  for (const auto& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& var : spec.envp) envp.push_back(const_cast<char*>(var.c_str()));
  envp.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : spec.cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  }
  const std::string exec_error = fmt::format("dscpp: cannot execute {}: ", spec.path);
  const std::string affinity_error = "dscpp: cannot set the CPU affinity of a rank: ";
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The launcher may have died before PDEATHSIG was armed.
    if (::getppid() != parent) ::_exit(128 + SIGKILL);
    if (spec.stdin_fd >= 0) ::dup2(spec.stdin_fd, 0);
    if (spec.output_fd >= 0) {
      ::dup2(spec.output_fd, 1);
      ::dup2(spec.output_fd, 2);
    }
    if (spec.stderr_fd >= 0) ::dup2(spec.stderr_fd, 2);
    if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      write_quietly(2, affinity_error + std::strerror(errno) + "\n");
      ::_exit(126);
    }
    // SIGPIPE's default action, whatever the launcher's: a rank writing into a closed pipe
    // ends as it would without a launcher, as DeepSpeed's ranks do (Python's subprocess
    // restores SIGPIPE for them).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
    ::execve(spec.path.c_str(), argv.data(), envp.data());
    write_quietly(2, exec_error + std::strerror(errno) + "\n");
    ::_exit(127);
  }
  // Also set from this side so a signal sent right after spawning finds the group.
  ::setpgid(pid, pid);
  const int32_t group = pid;
  if (guardian_fd_ >= 0) ::send(guardian_fd_, &group, sizeof(group), MSG_NOSIGNAL);
  return pid;
}

pid_t Supervisor::spawn_member(const ChildSpec& spec, const std::string& label) {
  const pid_t pid = fork_exec(spec);
  members_.push_back({pid, label, true, ""});
  ++alive_members_;
  return pid;
}

pid_t Supervisor::spawn_helper(const ChildSpec& spec) {
  const pid_t pid = fork_exec(spec);
  helpers_.insert(pid);
  return pid;
}

std::vector<pid_t> Supervisor::member_pids() const {
  std::vector<pid_t> pids;
  for (const Member& m : members_) pids.push_back(m.pid);
  return pids;
}

bool Supervisor::reap() {
  // Everything that ended since the last look, the successful exits handled first: waitpid's
  // order is not the order of death, and a failure's message names the peers already gone.
  std::vector<std::pair<pid_t, int>> ended;
  bool any_left = true;
  while (true) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      ended.emplace_back(pid, status);
      continue;
    }
    if (pid < 0 && errno == EINTR) continue;
    any_left = pid == 0;  // else ECHILD: no child, and as a subreaper, no descendant either
    break;
  }
  std::stable_partition(ended.begin(), ended.end(),
                        [](const auto& e) { return exit_code_of(e.second) == 0; });
  for (const auto& [pid, status] : ended) on_exit(pid, status);
  return any_left;
}

void Supervisor::on_exit(pid_t pid, int status) {
  helpers_.erase(pid);
  for (Member& m : members_) {
    if (m.pid != pid || !m.alive) continue;
    m.alive = false;
    m.ended = describe_exit(status);
    --alive_members_;
    const int code = exit_code_of(status);
    if (state_ == State::kRunning && code != 0) {
      exit_code_ = code;
      exit_code_set_ = true;
      // The members that ended before it, successfully or not: a peer that finished (or died
      // unnoticed) first is often why this one failed ("connection reset by peer").
      std::string before;
      for (const Member& o : members_)
        if (!o.alive && &o != &m)
          before += fmt::format("{}{} {}", before.empty() ? "" : ", ", o.label, o.ended);
      say("dscpp: {} (pid {}) {}; stopping the others{}\n", m.label, pid, m.ended,
          before.empty() ? "" : " (already ended: " + before + ")");
      begin_teardown(false);
    }
    return;
  }
  // Any other pid is an adopted orphan; reaping it is all there is to do.
}

void Supervisor::on_signal(int signo) {
  if (signo == SIGCHLD) return;
  if (state_ != State::kRunning) {
    // A second request to stop: do not wait out the grace period.
    escalate();
    return;
  }
  if (!exit_code_set_) {
    exit_code_ = 128 + signo;
    exit_code_set_ = true;
  }
  say("dscpp: received {}, stopping all ranks\n", strsignal(signo));
  if (signo != SIGTERM) {
    for (const Member& m : members_) ::kill(-m.pid, signo);
  }
  begin_teardown(true);
}

void Supervisor::on_stdin() {
  char buffer[512];
  const ssize_t n = ::read(0, buffer, sizeof(buffer));
  if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN))) return;
  watch_stdin_ = false;
  if (state_ != State::kRunning) return;
  if (!exit_code_set_) {
    exit_code_ = 128 + SIGHUP;
    exit_code_set_ = true;
  }
  say("dscpp: lost the connection to the runner, stopping all ranks\n");
  begin_teardown(true);
}

void Supervisor::watch_output(int fd, const std::string& label, LineWatch on_line) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  watches_.push_back({fd, label, std::move(on_line), {}});
}

void Supervisor::on_output(size_t index) {
  OutputWatch& w = watches_[index];
  char buffer[4096];
  const ssize_t n = ::read(w.fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // the writer is gone: what is left of a line is still shown
    if (!w.pending.empty()) write_quietly(2, w.pending);
    ::close(w.fd);
    w.fd = -1;
    return;
  }
  write_quietly(2, std::string(buffer, static_cast<size_t>(n)));
  w.pending.append(buffer, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t end; (end = w.pending.find('\n', start)) != std::string::npos; start = end + 1) {
    const auto code = w.on_line(w.pending.substr(start, end - start));
    if (code && *code != 0 && state_ == State::kRunning) {
      exit_code_ = *code;
      exit_code_set_ = true;
      say("dscpp: {} reported a failure (exit code {}); stopping the others\n", w.label, *code);
      begin_teardown(false);
    }
  }
  w.pending.erase(0, start);
  if (w.pending.size() > (1 << 16)) w.pending.clear();  // no line ending: nothing to match
}

void Supervisor::begin_teardown(bool by_signal) {
  state_ = State::kTerminating;
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(grace_seconds_));
  watch_stdin_ = false;
  // Groups of members that already exited may still hold their children.
  for (const Member& m : members_) {
    ::kill(-m.pid, SIGTERM);
    // A stopped process would only see SIGTERM once continued.
    ::kill(-m.pid, SIGCONT);
  }
  signal_stragglers();
  if (hook_ && !teardown_hook_called_) {
    teardown_hook_called_ = true;
    hook_(by_signal);
  }
}

void Supervisor::escalate() {
  if (state_ != State::kKilling) {
    state_ = State::kKilling;
    // Only a process stuck in the kernel survives SIGKILL; do not wait for it forever.
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(std::max(grace_seconds_, 1.0)));
  }
  signal_stragglers();
}

void Supervisor::signal_stragglers() {
  if (state_ == State::kKilling) {
    for (const Member& m : members_) ::kill(-m.pid, SIGKILL);
    for (const ProcEntry& child : list_children()) ::kill(child.pid, SIGKILL);
    return;
  }
  for (const ProcEntry& child : list_children()) {
    bool in_member_group = false;
    for (const Member& m : members_) in_member_group = in_member_group || child.pgid == m.pid;
    if (in_member_group || helpers_.count(child.pid) || sent_term_.count(child.pid)) continue;
    sent_term_.insert(child.pid);
    ::kill(child.pid, SIGTERM);
  }
}

int Supervisor::poll_timeout_ms() const {
  if (state_ == State::kRunning) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count()) + 1;
}

int Supervisor::run() {
  while (reap()) {
    if (state_ == State::kRunning && alive_members_ == 0) {
      // Every member succeeded but something they started is still running.
      begin_teardown(false);
    } else if (state_ != State::kRunning) {
      // Orphans adopted since the last pass get their signal too.
      signal_stragglers();
    }
    std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}, {watch_stdin_ ? 0 : -1, POLLIN, 0}};
    for (const OutputWatch& w : watches_) fds.push_back({w.fd, POLLIN, 0});  // -1: ignored
    const int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    if (n < 0 && errno != EINTR) throw_errno("poll");
    for (size_t i = 0; n > 0 && i < watches_.size(); ++i) {
      if (fds[2 + i].fd >= 0 && fds[2 + i].revents) on_output(i);
    }
    if (n > 0 && (fds[0].revents & POLLIN)) {
      signalfd_siginfo info;
      while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        on_signal(static_cast<int>(info.ssi_signo));
      }
    }
    if (n > 0 && watch_stdin_ && fds[1].fd >= 0 && fds[1].revents) on_stdin();
    if (state_ != State::kRunning && Clock::now() >= deadline_) {
      if (state_ == State::kKilling) {
        say("dscpp: some processes survive SIGKILL; giving up on them\n");
        break;
      }
      escalate();
    }
  }
  for (size_t i = 0; i < watches_.size(); ++i) {
    while (watches_[i].fd >= 0) {  // the rest of what the members wrote
      pollfd p{watches_[i].fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) break;
      on_output(i);
    }
    if (watches_[i].fd >= 0) ::close(watches_[i].fd);
    watches_[i].fd = -1;
  }
  if (guardian_fd_ >= 0) {
    const int32_t done = 0;
    ::send(guardian_fd_, &done, sizeof(done), MSG_NOSIGNAL);
    ::close(guardian_fd_);
    guardian_fd_ = -1;
  }
  alive_members_ = 0;
  return exit_code_;
}

}  // namespace dscpp::launcher
