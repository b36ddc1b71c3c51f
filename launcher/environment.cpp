#include "environment.h"

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>

#include "errors.h"
#include "text.h"

extern char** environ;

namespace dscpp::launcher {
namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

void set_env(EnvList& env, const std::string& name, const std::string& value) {
  for (auto& [key, val] : env) {
    if (key == name) {
      val = value;
      return;
    }
  }
  env.emplace_back(name, value);
}

std::optional<std::string> get_env(const EnvList& env, const std::string& name) {
  for (const auto& [key, val] : env) {
    if (key == name) return val;
  }
  return std::nullopt;
}

EnvList current_environment() {
  EnvList env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string item = *entry;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    set_env(env, item.substr(0, eq), item.substr(eq + 1));
  }
  return env;
}

std::vector<std::string> to_envp(const EnvList& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, val] : env) out.push_back(key + "=" + val);
  return out;
}

EnvList parse_env_file(const std::string& text, const std::string& origin) {
  EnvList entries;
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    // A NUL would cut the variable short on its way to execve and to the remote shell.
    const size_t nul = raw.find('\0');
    if (nul != std::string::npos) {
      throw UserError(fmt::format("{}:{}:{}: NUL byte in the entry", origin, line_no, nul + 1));
    }
    const std::string name = eq == std::string::npos ? "" : trim(line.substr(0, eq));
    if (name.empty()) {
      throw UserError(fmt::format("{}:{}: expected NAME=VALUE, got '{}'", origin, line_no, line));
    }
    set_env(entries, name, trim(line.substr(eq + 1)));
  }
  return entries;
}

EnvList read_deepspeed_env(const EnvList& environment, const std::string& cwd) {
  const std::string name = get_env(environment, "DS_ENV_FILE").value_or(".deepspeed_env");
  std::vector<std::string> paths;
  if (!name.empty() && name[0] == '/') {
    paths.push_back(name);  // os.path.join ignores the directory for an absolute name
  } else {
    if (auto home = get_env(environment, "HOME"); home && !home->empty()) {
      paths.push_back(*home + "/" + name);
    }
    paths.push_back(cwd + "/" + name);
  }
  EnvList merged;
  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    std::string text(kMaxEnvFileBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxEnvFileBytes) {
      throw UserError(fmt::format("{}: more than the {} bytes an environment file may have", path,
                                  kMaxEnvFileBytes));
    }
    for (const auto& [key, val] : parse_env_file(text, path)) set_env(merged, key, val);
  }
  return merged;
}

std::string ensure_job_id(EnvList& env) {
  if (auto id = get_env(env, kJobIdVariable); id && !id->empty()) return *id;
  std::random_device random;
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  const std::string id =
      fmt::format("{}-{:x}-{:08x}", ::getpid(), static_cast<uint64_t>(now), random());
  set_env(env, kJobIdVariable, id);
  return id;
}

EnvList collect_exports(const EnvList& environment, const EnvList& env_file) {
  static const char* kPrefixes[] = {"MLFLOW", "PYTHON", "MV2", "UCX", "NCCL", "DSCPP"};
  // Nodes of an AISC job set these independently; exporting rank 0's values would be wrong.
  const bool aisc = get_env(environment, "AISC_JOB_NAME").has_value();
  EnvList exports;
  for (const auto& [key, val] : environment) {
    bool wanted = false;
    for (const char* prefix : kPrefixes) wanted = wanted || starts_with(key, prefix);
    if (aisc && (key == "NCCL_IB_HCA" || key == "UCX_NET_DEVICES")) wanted = false;
    if (wanted) set_env(exports, key, trim(val));
  }
  for (const auto& [key, val] : env_file) set_env(exports, key, val);
  return exports;
}

}  // namespace dscpp::launcher
