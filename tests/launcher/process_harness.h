// Helpers for the launcher's process tests: run the real `dscpp` binary with a controlled
// environment and a timeout, read what fake_rank wrote, and check that processes are gone.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#ifndef FAKE_RANK_BIN
#error "FAKE_RANK_BIN must name the fake_rank binary"
#endif

namespace dscpp::launcher::testing {

// The fake_rank binary: the training program that the process tests launch.
inline const std::string kFakeRank = FAKE_RANK_BIN;

// A fresh directory under /tmp, removed with its contents at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& text, bool executable = false);
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);

struct Result {
  int code = -1;  // exit code, or 128+S when killed by signal S
  double seconds = 0;
  std::string out;
  std::string err;
};

class Launch {
 public:
  // Where the launcher's stdout and stderr go: files (read back into Result), or a pipe
  // whose reader is already gone (`dscpp ... 2>&1 | head` after head exited): every write
  // fails with EPIPE, and raises SIGPIPE unless the launcher starts with it ignored (as a
  // Python parent leaves it: kClosedPipeSigpipeIgnored).
  enum class Output { kFiles, kClosedPipe, kClosedPipeSigpipeIgnored };
  // Starts `dscpp args...` in `cwd`. The child environment is this process's minus the
  // variables that would change dscpp's behaviour, with HOME set to an empty directory and
  // DS_ACCELERATOR=cpu (the fake ranks need no GPU), then `env` applied (an empty value
  // removes the variable).
  Launch(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
         const std::string& cwd, Output output = Output::kFiles);
  ~Launch();
  pid_t pid() const { return pid_; }
  // Waits at most `timeout_s`; on timeout the launcher is SIGKILLed and code is -1.
  Result wait(double timeout_s = 20);

 private:
  TempDir io_;
  pid_t pid_ = -1;
  bool done_ = false;
  std::chrono::steady_clock::time_point start_;
};

Result run_dscpp(const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env = {},
                 const std::string& cwd = "/tmp", double timeout_s = 20);

// What fake_rank recorded in <dir>/rank<R>.txt.
struct RankInfo {
  pid_t pid = 0;
  pid_t pgid = 0;
  pid_t grandchild = 0;
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string affinity;
  bool signals_blocked = true;
  bool sigpipe_ignored = true;
};
std::optional<RankInfo> read_rank(const std::string& dir, int rank);
// Polls until ranks 0..n-1 have written their files.
bool wait_for_ranks(const std::string& dir, int n, double timeout_s = 10);

// Gone means no such process, or a zombie (exited, only waiting for its parent to reap it).
bool process_gone(pid_t pid);
bool group_gone(pid_t pgid);
// Polls until every pid and group is gone; returns the ones that are not.
std::vector<pid_t> still_alive(const std::vector<RankInfo>& ranks, double timeout_s = 0);

}  // namespace dscpp::launcher::testing
