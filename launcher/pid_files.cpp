// The --save_pid files: see pid_files.h.
#include "pid_files.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>

#include "output.h"

namespace dscpp::launcher {
namespace {

constexpr const char* kSuffix = ".deepspeed";

// N when `name` is "<N><suffix>" with N all digits; -1 otherwise.
long owner_of(const std::string& name, const std::string& suffix) {
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(0, name.size() - suffix.size());
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stol(digits);
}

// The pid a .deepspeed file holds; -1 when it holds none.
long pid_in(const std::string& path) {
  std::ifstream in(path);
  long pid = -1;
  if (!(in >> pid) || pid <= 0) return -1;
  return pid;
}

bool alive(long pid) {
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

std::string pid_file_path(const std::string& dir, int owner) {
  return fmt::format("{}/{}{}", dir, owner, kSuffix);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    say("dscpp: warning: cannot write {}: {}\n", path, std::strerror(errno));
    return;
  }
  const bool written = std::fputs(text.c_str(), f) >= 0 && std::fflush(f) == 0;
  const int error = errno;
  std::fclose(f);
  if (!written) {
    say("dscpp: warning: cannot write {}: {}\n", path, std::strerror(error));
    std::remove(tmp.c_str());
    return;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    say("dscpp: warning: cannot write {}: {}\n", path, std::strerror(errno));
    std::remove(tmp.c_str());
  }
}

std::vector<std::string> remove_stale_pid_files(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return removed;
  std::set<std::string> names;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.find(kSuffix) != std::string::npos) names.insert(name);
  }
  ::closedir(d);
  const uid_t me = ::geteuid();
  const std::time_t now = std::time(nullptr);
  auto ours = [&](const std::string& path, struct stat* st) {
    return ::lstat(path.c_str(), st) == 0 && S_ISREG(st->st_mode) && st->st_uid == me;
  };
  auto remove = [&](const std::string& path) {
    if (::unlink(path.c_str()) == 0) removed.push_back(path);
  };
  const std::string ranks = std::string(kSuffix) + ".ranks";
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (owner_of(name, kSuffix) >= 0) {
      const long pid = ours(path, &st) ? pid_in(path) : -1;
      if (pid > 0 && !alive(pid)) {
        remove(path);
        struct stat rst {};
        if (ours(path + ".ranks", &rst)) remove(path + ".ranks");
      }
    } else if (owner_of(name, ranks) >= 0) {
      const std::string launcher_file = name.substr(0, name.size() - 6);  // less ".ranks"
      if (names.count(launcher_file) == 0 && ours(path, &st)) remove(path);
    } else if (owner_of(name, std::string(kSuffix) + ".tmp") >= 0 ||
               owner_of(name, ranks + ".tmp") >= 0) {
      if (ours(path, &st) && now - st.st_mtime > 60) remove(path);
    }
  }
  return removed;
}

}  // namespace dscpp::launcher
