// read_dist_env: every getenv of the library.
#include "dscpp/comm/launch_env.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

#include "dscpp/comm/process_group.h"

namespace dscpp::comm {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

long env_long(const char* name, long def, long lo, long hi, const char* what) {
  const char* v = env(name);
  if (!v) return def;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || x < lo || x > hi)
    throw CommError(fmt::format("environment variable {}='{}': expected {} in [{}, {}]", name, v,
                                what, lo, hi));
  return x;
}

int env_rank(const char* name, int def) {
  return static_cast<int>(env_long(name, def, 0, 1 << 30, "a rank number"));
}

}  // namespace

DistEnv read_dist_env() {
  DistEnv e;
  if (env("RANK")) {
    if (!env("WORLD_SIZE")) throw CommError("RANK is set but WORLD_SIZE is not");
    e.rank = env_rank("RANK", 0);
    e.world_size = env_rank("WORLD_SIZE", 1);
    e.local_rank = env_rank("LOCAL_RANK", 0);
    e.local_size = env_rank("LOCAL_SIZE", 1);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    e.rank = env_rank("OMPI_COMM_WORLD_RANK", 0);
    e.world_size = env_rank("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = env_rank("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_size = env_rank("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  }
  if (const char* a = env("MASTER_ADDR")) e.master_addr = a;
  e.master_port = static_cast<int>(env_long("MASTER_PORT", e.master_port, 1, 65535, "a TCP port"));
  if (e.world_size < 1 || e.rank >= e.world_size)
    throw CommError(fmt::format("rank {} is outside a world of {}", e.rank, e.world_size));
  if (e.world_size > 1 && !env("MASTER_ADDR"))
    throw CommError(
        "MASTER_ADDR is not set: start the job with the dscpp launcher or set "
        "MASTER_ADDR and MASTER_PORT");
  if (const char* i = env("GLOO_SOCKET_IFNAME")) e.gloo_socket_ifname = i;
  // DeepSpeed reads int(os.getenv("DEEPSPEED_TIMEOUT")) as minutes; a week is the ceiling.
  if (env("DEEPSPEED_TIMEOUT"))
    e.timeout = std::chrono::minutes(
        env_long("DEEPSPEED_TIMEOUT", 0, 1, 7 * 24 * 60, "a timeout in whole minutes"));
  if (const char* j = env("DSCPP_JOB_ID")) e.job_id = j;
  return e;
}

}  // namespace dscpp::comm
