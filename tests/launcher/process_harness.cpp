#include "process_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#ifndef DSCPP_BIN
#error "DSCPP_BIN must name the dscpp binary"
#endif

extern char** environ;

namespace dscpp::launcher::testing {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool removed_variable(const std::string& name) {
  // Anything that would make the launcher behave differently from what a test expects.
  static const char* kNames[] = {"CUDA_VISIBLE_DEVICES", "DS_ACCELERATOR", "DS_ENV_FILE",
                                 "DSCPP_KILL_GRACE_S",   "HOME",           "DSCPP_JOB_ID",
                                 "KMP_AFFINITY",         "OMP_NUM_THREADS"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace

TempDir::TempDir() {
  char pattern[] = "/tmp/dscpp_test_XXXXXX";
  if (::mkdtemp(pattern) == nullptr) std::abort();
  path_ = pattern;
}

TempDir::~TempDir() {
  const std::string cmd = "rm -rf '" + path_ + "'";
  if (std::system(cmd.c_str()) != 0) {
    // Best effort: a leftover directory under /tmp is harmless.
  }
}

void write_file(const std::string& path, const std::string& text, bool executable) {
  std::ofstream(path) << text;
  if (executable) ::chmod(path.c_str(), 0755);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

Launch::Launch(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
               const std::string& cwd, Output output) {
  std::vector<std::string> envp;
  for (char** e = environ; *e; ++e) {
    const std::string item = *e;
    const std::string name = item.substr(0, item.find('='));
    if (removed_variable(name) || env.count(name)) continue;
    envp.push_back(item);
  }
  envp.push_back("HOME=" + io_.path());
  // The fake ranks use no GPU: CPU ranks, as many as a test asks for, on a GPU machine too,
  // where the launcher would refuse more ranks than GPUs (a test may set its own value).
  if (!env.count("DS_ACCELERATOR")) envp.push_back("DS_ACCELERATOR=cpu");
  for (const auto& [name, value] : env) {
    if (!value.empty()) envp.push_back(name + "=" + value);
  }
  std::vector<std::string> argv = {DSCPP_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> argv_c, envp_c;
  for (auto& a : argv) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  for (auto& e : envp) envp_c.push_back(e.data());
  envp_c.push_back(nullptr);
  const std::string out = io_ / "stdout", err = io_ / "stderr";
  int pipe_fds[2] = {-1, -1};
  if (output != Output::kFiles) {
    if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
    ::close(pipe_fds[0]);  // the reader is gone before the first write
  }

  start_ = Clock::now();
  pid_ = ::fork();
  if (pid_ == 0) {
    // SIGPIPE's default action, as a shell gives it, whatever the test runner's.
    ::signal(SIGPIPE, output == Output::kClosedPipeSigpipeIgnored ? SIG_IGN : SIG_DFL);
    const int out_fd =
        pipe_fds[1] >= 0 ? pipe_fds[1] : ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd =
        pipe_fds[1] >= 0 ? pipe_fds[1] : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(in_fd, 0);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    if (::chdir(cwd.c_str()) != 0) ::_exit(120);
    ::execve(argv_c[0], argv_c.data(), envp_c.data());
    ::_exit(121);
  }
  if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
}

Launch::~Launch() {
  if (!done_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

Result Launch::wait(double timeout_s) {
  Result result;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (since(start_) > timeout_s) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      done_ = true;
      result.code = -1;
      result.seconds = since(start_);
      result.out = read_file(io_ / "stdout");
      result.err = read_file(io_ / "stderr");
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  done_ = true;
  result.seconds = since(start_);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_file(io_ / "stdout");
  result.err = read_file(io_ / "stderr");
  return result;
}

Result run_dscpp(const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env, const std::string& cwd,
                 double timeout_s) {
  Launch launch(args, env, cwd);
  return launch.wait(timeout_s);
}

std::optional<RankInfo> read_rank(const std::string& dir, int rank) {
  std::ifstream in(dir + "/rank" + std::to_string(rank) + ".txt");
  if (!in) return std::nullopt;
  RankInfo info;
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    const std::string key = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (key == "pid") info.pid = std::stoi(value);
    if (key == "pgid") info.pgid = std::stoi(value);
    if (key == "grandchild") info.grandchild = std::stoi(value);
    if (key == "arg") info.args.push_back(value);
    if (key == "affinity") info.affinity = value;
    if (key == "blocked") info.signals_blocked = value != "0";
    if (key == "sigpipe_ignored") info.sigpipe_ignored = value != "0";
    if (key == "env") {
      const size_t eq = value.find('=');
      info.env[value.substr(0, eq)] = value.substr(eq + 1);
    }
  }
  return info;
}

bool wait_for_ranks(const std::string& dir, int n, double timeout_s) {
  const auto start = Clock::now();
  while (since(start) < timeout_s) {
    bool all = true;
    for (int r = 0; r < n && all; ++r)
      all = file_exists(dir + "/rank" + std::to_string(r) + ".txt");
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

bool process_gone(pid_t pid) {
  if (pid <= 0) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

bool group_gone(pid_t pgid) {
  if (pgid <= 0) return true;
  if (::kill(-pgid, 0) != 0 && errno == ESRCH) return true;
  // A group holding only zombies also counts as gone.
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return false;
  bool live_member = false;
  while (dirent* entry = ::readdir(proc)) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    char state = 0;
    long ppid = 0, group = 0;
    if (!(fields >> state >> ppid >> group)) continue;
    if (group == pgid && state != 'Z') live_member = true;
  }
  ::closedir(proc);
  return !live_member;
}

std::vector<pid_t> still_alive(const std::vector<RankInfo>& ranks, double timeout_s) {
  const auto start = Clock::now();
  std::vector<pid_t> alive;
  do {
    alive.clear();
    for (const RankInfo& r : ranks) {
      if (!process_gone(r.pid)) alive.push_back(r.pid);
      if (!process_gone(r.grandchild)) alive.push_back(r.grandchild);
      if (!group_gone(r.pgid)) alive.push_back(-r.pgid);
    }
    if (alive.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (since(start) < timeout_s);
  return alive;
}

}  // namespace dscpp::launcher::testing
