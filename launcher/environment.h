// Environment handling shared by the local launcher and the multi-node runners: ordered
// NAME=VALUE lists, DeepSpeed's `.deepspeed_env` files, and which variables a multi-node
// runner forwards to remote hosts. Order is kept everywhere so generated command lines are
// deterministic and testable.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dscpp::launcher {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Replaces NAME in place (keeping its position, as a Python dict update does) or appends it.
void set_env(EnvList& env, const std::string& name, const std::string& value);
std::optional<std::string> get_env(const EnvList& env, const std::string& name);

EnvList current_environment();
std::vector<std::string> to_envp(const EnvList& env);

// `NAME=VALUE` lines; blank lines and `#` comments are skipped, name and value are trimmed,
// the value is taken literally (no quote processing). A line without '=', or with a NUL
// byte, throws UserError naming the line.
EnvList parse_env_file(const std::string& text, const std::string& origin);

// DeepSpeed reads $HOME/<name> first, then ./<name>, so the working directory wins. The file
// name comes from DS_ENV_FILE and defaults to .deepspeed_env. Missing files are skipped.
EnvList read_deepspeed_env(const EnvList& environment, const std::string& cwd);

// .deepspeed_env files larger than this are refused (they are read whole into every rank).
inline constexpr size_t kMaxEnvFileBytes = 1 << 20;

// The launch's identity, read by comm/launch_env.cpp: rank 0 publishes it in the store and
// the other ranks refuse a store of another job (two jobs started on one --master_port).
inline constexpr const char* kJobIdVariable = "DSCPP_JOB_ID";

// Keeps a DSCPP_JOB_ID the user set, else sets a fresh one (pid, time, random bits) in
// `env`; returns it. The DSCPP_ prefix carries it to every host of a multi-node job.
std::string ensure_job_id(EnvList& env);

// Variables a multi-node runner exports to every host: those whose names start with one of
// DeepSpeed's prefixes (NCCL, PYTHON, UCX, MV2, MLFLOW) or DSCPP, minus the ones DeepSpeed
// holds back on AISC clusters, followed by the .deepspeed_env entries.
EnvList collect_exports(const EnvList& environment, const EnvList& env_file);

}  // namespace dscpp::launcher
