// read_dist_env and init_distributed.
#include "dscpp/comm/rendezvous.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <numeric>

#include "dscpp/comm/backend.h"

#ifdef DSCPP_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dscpp::comm {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int def) {
  const char* v = env(name);
  if (!v) return def;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 30)
    throw CommError(fmt::format("environment variable {}={} is not a rank number", name, v));
  return static_cast<int>(x);
}

bool cuda_visible() {
#ifdef DSCPP_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

}  // namespace

DistEnv read_dist_env() {
  DistEnv e;
  if (env("RANK")) {
    if (!env("WORLD_SIZE")) throw CommError("RANK is set but WORLD_SIZE is not");
    e.rank = env_int("RANK", 0);
    e.world_size = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int("LOCAL_RANK", 0);
    e.local_size = env_int("LOCAL_SIZE", 1);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    e.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    e.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  }
  if (const char* a = env("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", e.master_port);
  if (e.world_size < 1 || e.rank >= e.world_size)
    throw CommError(fmt::format("rank {} is outside a world of {}", e.rank, e.world_size));
  if (e.world_size > 1 && !env("MASTER_ADDR"))
    throw CommError(
        "MASTER_ADDR is not set: start the job with the dscpp launcher or set "
        "MASTER_ADDR and MASTER_PORT");
  return e;
}

std::shared_ptr<ProcessGroup> init_distributed(const InitOptions& options) {
  DistEnv e = read_dist_env();
  std::string kind = options.backend;
  if (kind == "auto") kind = cuda_visible() ? "nccl" : "gloo";
  if (kind != "gloo" && kind != "nccl")
    throw CommError(fmt::format("unknown backend '{}': expected gloo, nccl or auto", kind));

  c10::intrusive_ptr<c10d::Store> store;
  if (e.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(e.master_port);
    so.isServer = e.rank == 0;
    so.numWorkers = e.world_size;
    so.waitWorkers = true;
    so.timeout = options.timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, so);
    } catch (const std::exception& ex) {
      throw CommError(fmt::format("rank {} of {} could not reach the store at {}:{}: {}", e.rank,
                                  e.world_size, e.master_addr, e.master_port, ex.what()));
    }
  }
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world/", store);
  std::shared_ptr<BackendHandle> handle;
  try {
    handle =
        kind == "nccl"
            ? make_nccl_backend(world_store, e.rank, e.world_size, options.timeout,
                                options.device_index >= 0 ? options.device_index : e.local_rank)
            : make_gloo_backend(world_store, e.rank, e.world_size, options.timeout, e.master_addr);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& ex) {
    throw CommError(fmt::format("rank {} of {} could not create the {} group: {}", e.rank,
                                e.world_size, kind, ex.what()));
  }
  std::vector<int> ranks(e.world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  return std::make_shared<ProcessGroup>(handle, "world", ranks, options.timeout);
}

}  // namespace dscpp::comm
