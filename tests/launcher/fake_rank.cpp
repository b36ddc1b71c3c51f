// A stand-in for a training program in the launcher's process tests (no LibTorch). dscpp
// starts it as a rank; arguments of the form key=value tell it what to do, in this order:
//   ignore_term=R|all  ignore SIGTERM (rank R, or every rank); a grandchild inherits it
//   grandchild=1|setsid  fork a grandchild that sleeps; `setsid` moves it out of the
//                      rank's process group and its OS session
//   out=DIR            write DIR/rank<R>.txt: pid, pgid, grandchild pid, argv, environment,
//                      CPU affinity, signal state (atomically, so a file that exists is
//                      complete)
//   wait_peers=1       wait until WORLD_SIZE rank files exist in DIR
//   wait_file=PATH     wait until PATH exists
//   print=TEXT         print "TEXT rank R" to stdout and "stderr TEXT rank R" to stderr
//   exit=R:CODE        rank R exits with CODE
//   signal=R:SIG       rank R kills itself with signal SIG
//   on_term=1          on SIGTERM, create DIR/rank<R>.term (out=DIR) and exit 143: shows
//                      that the launcher's teardown reached the rank
//   sleep=SECONDS      sleep, then exit 0 (default: exit 0 at once)
//   late_exit=R:CODE   rank R exits with CODE after the sleep instead of 0
// Any other argument (such as --local_rank=N) is only recorded. Waits give up after 20 s.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void wait_until(const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// on_term's file, made before the handler is installed: a handler may only make system calls.
char term_path[4096];

void on_term(int) {
  const int fd = ::open(term_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) ::close(fd);
  ::_exit(128 + SIGTERM);
}

// Applies to this rank when the target is "all" or equals the rank number.
bool for_me(const std::string& target, int rank) {
  return target == "all" || target == std::to_string(rank);
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank_env = std::getenv("RANK");
  const int rank = rank_env ? std::atoi(rank_env) : -1;
  const char* world_env = std::getenv("WORLD_SIZE");
  const int world = world_env ? std::atoi(world_env) : 1;

  std::string out_dir, wait_file, grandchild_mode, print_text;
  bool wait_peers = false, term_file = false;
  double sleep_s = 0;
  int exit_code = -1, signal_no = 0, late_exit_code = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || arg.compare(0, 2, "--") == 0) continue;
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    const size_t colon = value.find(':');
    const std::string target = value.substr(0, colon);
    const std::string action = colon == std::string::npos ? "" : value.substr(colon + 1);
    if (key == "out") out_dir = value;
    if (key == "wait_peers") wait_peers = value == "1";
    if (key == "on_term") term_file = value == "1";
    if (key == "wait_file") wait_file = value;
    if (key == "grandchild") grandchild_mode = value;
    if (key == "print") print_text = value;
    if (key == "sleep") sleep_s = std::atof(value.c_str());
    if (key == "ignore_term" && for_me(value, rank)) ::signal(SIGTERM, SIG_IGN);
    if (key == "exit" && for_me(target, rank)) exit_code = std::atoi(action.c_str());
    if (key == "signal" && for_me(target, rank)) signal_no = std::atoi(action.c_str());
    if (key == "late_exit" && for_me(target, rank)) late_exit_code = std::atoi(action.c_str());
  }

  if (term_file && !out_dir.empty()) {
    std::snprintf(term_path, sizeof(term_path), "%s/rank%d.term", out_dir.c_str(), rank);
    ::signal(SIGTERM, on_term);
  }

  pid_t grandchild = 0;
  if (!grandchild_mode.empty()) {
    grandchild = ::fork();
    if (grandchild == 0) {
      if (grandchild_mode == "setsid") ::setsid();
      for (int i = 0; i < 600; ++i) ::usleep(100000);
      ::_exit(0);
    }
  }

  if (!out_dir.empty()) {
    const std::string path = out_dir + "/rank" + std::to_string(rank) + ".txt";
    {
      std::ofstream out(path + ".tmp");
      out << "pid " << ::getpid() << "\n";
      out << "pgid " << ::getpgid(0) << "\n";
      out << "grandchild " << grandchild << "\n";
      for (int i = 1; i < argc; ++i) out << "arg " << argv[i] << "\n";
      for (char** e = environ; *e; ++e) out << "env " << *e << "\n";
      cpu_set_t cpus;
      CPU_ZERO(&cpus);
      std::string affinity;
      if (::sched_getaffinity(0, sizeof(cpus), &cpus) == 0) {
        for (int c = 0; c < CPU_SETSIZE; ++c) {
          if (CPU_ISSET(c, &cpus)) affinity += (affinity.empty() ? "" : ",") + std::to_string(c);
        }
      }
      out << "affinity " << affinity << "\n";
      // What the launcher must not leak into a rank: blocked or ignored signals.
      sigset_t blocked;
      ::sigprocmask(SIG_BLOCK, nullptr, &blocked);
      struct sigaction pipe_action {};
      ::sigaction(SIGPIPE, nullptr, &pipe_action);
      out << "blocked "
          << (sigismember(&blocked, SIGTERM) || sigismember(&blocked, SIGINT) ||
              sigismember(&blocked, SIGCHLD) || sigismember(&blocked, SIGHUP))
          << "\n";
      out << "sigpipe_ignored " << (pipe_action.sa_handler == SIG_IGN) << "\n";
    }
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  if (wait_peers && !out_dir.empty()) {
    wait_until([&] {
      for (int r = 0; r < world; ++r) {
        if (!exists(out_dir + "/rank" + std::to_string(r) + ".txt")) return false;
      }
      return true;
    });
  }
  if (!wait_file.empty()) wait_until([&] { return exists(wait_file); });
  if (!print_text.empty()) {
    std::printf("%s rank %d\n", print_text.c_str(), rank);
    std::fflush(stdout);
    std::fprintf(stderr, "stderr %s rank %d\n", print_text.c_str(), rank);
  }
  if (signal_no != 0) {
    ::signal(signal_no, SIG_DFL);
    ::raise(signal_no);
  }
  if (exit_code >= 0) return exit_code;
  if (sleep_s > 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(sleep_s);
    while (std::chrono::steady_clock::now() < end) ::usleep(20000);
  }
  return late_exit_code;
}
