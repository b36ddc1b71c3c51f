#include "devices.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <utility>

namespace dscpp::launcher {
namespace {

int count_entries(const char* dir, bool (*accept)(const std::string&)) {
  DIR* d = ::opendir(dir);
  if (d == nullptr) return 0;
  int count = 0;
  while (dirent* entry = ::readdir(d)) {
    if (accept(entry->d_name)) ++count;
  }
  ::closedir(d);
  return count;
}

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(),
                                      [](unsigned char c) { return std::isdigit(c) != 0; });
}

int read_int_file(const std::string& path) {
  std::ifstream in(path);
  int value = -1;
  in >> value;
  return in ? value : -1;
}

}  // namespace

int count_nvidia_gpus() {
  // The driver lists one directory per GPU (named by PCI address) here; /dev/nvidiaN is
  // the fallback for containers that bind-mount device nodes without /proc/driver.
  int count = count_entries("/proc/driver/nvidia/gpus",
                            [](const std::string& name) { return name[0] != '.'; });
  if (count > 0) return count;
  return count_entries("/dev", [](const std::string& name) {
    return name.size() > 6 && name.compare(0, 6, "nvidia") == 0 && all_digits(name.substr(6));
  });
}

int online_cpu_count() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::vector<int> physical_core_list() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    for (int i = 0; i < online_cpu_count() && i < CPU_SETSIZE; ++i) CPU_SET(i, &allowed);
  }
  std::set<std::pair<int, int>> seen_cores;
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const int package = read_int_file(topo + "physical_package_id");
    const int core = read_int_file(topo + "core_id");
    // Without topology information every logical CPU counts as a core.
    if (core >= 0 && !seen_cores.insert({package, core}).second) continue;
    cpus.push_back(cpu);
  }
  return cpus;
}

std::optional<std::vector<int>> parse_device_ids(const std::string& text) {
  std::vector<int> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!all_digits(item) || item.size() > 6) return std::nullopt;
    ids.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

}  // namespace dscpp::launcher
