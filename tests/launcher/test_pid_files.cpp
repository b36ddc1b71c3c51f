// remove_stale_pid_files: which --save_pid files a launch removes (those whose launcher is
// gone) and which it leaves (a live launcher's, anything that is not such a file).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <ctime>

#include "pid_files.h"
#include "process_harness.h"

namespace dscpp::launcher::testing {
namespace {

// The pid of a process that has exited and been reaped: no live process has it (a new
// process could take it over, but not within the test's moment).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(PidFiles, OnlyTheFilesOfLaunchersThatAreGoneAreRemoved) {
  TempDir dir;
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getpid());
  // A launcher that is gone: its file and its rank list.
  write_file(dir / "111.deepspeed", dead);
  write_file(dir / "111.deepspeed.ranks", "5\n6\n");
  // A live launcher, on this host (owner = itself) and on another host of a multi-node job
  // (owner = the runner's pid there): what counts is the pid written in the file.
  write_file(dir / (live + ".deepspeed"), live);
  write_file(dir / (live + ".deepspeed.ranks"), "7\n");
  write_file(dir / (dead + ".deepspeed"), live);
  // A rank list whose launcher file is gone.
  write_file(dir / "222.deepspeed.ranks", "8\n");
  // Temporary files: an old one is left over, a fresh one is being written.
  write_file(dir / "333.deepspeed.tmp", "9");
  const utimbuf old{std::time(nullptr) - 120, std::time(nullptr) - 120};
  ASSERT_EQ(::utime((dir / "333.deepspeed.tmp").c_str(), &old), 0);
  write_file(dir / "444.deepspeed.ranks.tmp", "10\n");
  // Not --save_pid files, or not holding a pid: left alone.
  write_file(dir / "notes.deepspeed", dead);
  write_file(dir / "555.deepspeed.bak", dead);
  write_file(dir / "666.deepspeed", "not a pid");
  ASSERT_EQ(::mkdir((dir / "777.deepspeed").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((dir / "111.deepspeed").c_str(), (dir / "888.deepspeed").c_str()), 0);

  std::vector<std::string> removed = remove_stale_pid_files(dir.path());
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed,
            (std::vector<std::string>{dir / "111.deepspeed", dir / "111.deepspeed.ranks",
                                      dir / "222.deepspeed.ranks", dir / "333.deepspeed.tmp"}));
  for (const std::string& kept : {live + ".deepspeed", live + ".deepspeed.ranks",
                                  dead + ".deepspeed", std::string("444.deepspeed.ranks.tmp"),
                                  std::string("notes.deepspeed"), std::string("555.deepspeed.bak"),
                                  std::string("666.deepspeed"), std::string("777.deepspeed")})
    EXPECT_TRUE(file_exists(dir / kept)) << kept;
  struct stat st {};
  EXPECT_EQ(::lstat((dir / "888.deepspeed").c_str(), &st), 0) << "the symlink was removed";
  // A second pass finds nothing more.
  EXPECT_TRUE(remove_stale_pid_files(dir.path()).empty());
  EXPECT_TRUE(remove_stale_pid_files(dir / "missing").empty());
}

}  // namespace
}  // namespace dscpp::launcher::testing
