// init_distributed: the store, the job check, the world group.
#include "dscpp/comm/rendezvous.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <mutex>
#include <numeric>

#include "dscpp/comm/backend.h"
#include "dscpp/comm/error_text.h"

#ifdef DSCPP_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dscpp::comm {

namespace {

bool cuda_visible() {
#ifdef DSCPP_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

// A store whose server closed the connection under a rank that had reached it: most often
// the server was another job's rank 0 on the same port, which finished (or failed) and went.
// The rank's own rank 0 may serve the port a moment later, but this rank already spoke to a
// stranger, so it fails, and says so.
std::string lost_server_hint(const std::exception& ex, const DistEnv& e) {
  const std::string text = error_text(ex);
  for (const char* lost : {"reset by peer", "Broken pipe", "closed by peer"})
    if (text.find(lost) != std::string::npos)
      return fmt::format(
          " (its server went away: another job using --master_port {} may have served it; give "
          "each job its own port)",
          e.master_port);
  return "";
}

// Rank 0 writes its job's identity into the store before anyone can use it; every other
// rank reads it back before it writes anything, so a rank of another job that reached this
// store (two jobs started at once on one port) fails here and never touches our keys.
void check_same_job(c10d::Store& store, const DistEnv& e) {
  const std::string key = "dscpp_job_id";
  const std::string ours = e.job_id.empty() ? "(none)" : e.job_id;
  if (e.rank == 0) {
    store.set(key, std::vector<uint8_t>(ours.begin(), ours.end()));
    return;
  }
  std::vector<uint8_t> raw = store.get(key);
  std::string theirs(raw.begin(), raw.end());
  if (theirs != ours)
    throw CommError(fmt::format(
        "rank {} of {} reached the store at {} port {}, but it belongs to another job (job id {}, "
        "ours {}): two jobs are using --master_port {}; give each job its own port",
        e.rank, e.world_size, e.master_addr, e.master_port, theirs, ours, e.master_port));
}

// The world this process joined, and what it was joined with: what a second init_distributed
// must agree with to be given it.
struct JoinedWorld {
  std::shared_ptr<ProcessGroup> group;
  DistEnv env;
  std::string backend;  // "gloo" or "nccl"
  std::chrono::milliseconds timeout{0};
  int device_index = -1;  // NCCL's device
};

std::mutex& world_mutex() {
  static std::mutex m;
  return m;
}

JoinedWorld& joined() {
  static JoinedWorld w;
  return w;
}

// Throws CommError listing every way the request differs from the world already joined.
void check_compatible(const JoinedWorld& w, const InitOptions& options, const DistEnv& e,
                      const std::string& backend, int device_index) {
  std::string differs;
  auto add = [&](const std::string& what) { differs += (differs.empty() ? "" : "; ") + what; };
  const DistEnv& o = w.env;
  if (e.rank != o.rank || e.world_size != o.world_size)
    add(fmt::format("the environment says rank {} of {}, the world was joined as rank {} of {}",
                    e.rank, e.world_size, o.rank, o.world_size));
  if (e.world_size > 1 && (e.master_addr != o.master_addr || e.master_port != o.master_port))
    add(fmt::format("MASTER_ADDR:MASTER_PORT is {}:{}, the world's is {}:{}", e.master_addr,
                    e.master_port, o.master_addr, o.master_port));
  if (e.job_id != o.job_id)
    add(fmt::format("DSCPP_JOB_ID is '{}', the world's is '{}'", e.job_id, o.job_id));
  if (options.backend != "auto" && backend != w.backend)
    add(fmt::format("backend {} was asked for, the world's is {}", backend, w.backend));
  if (options.timeout && *options.timeout != w.timeout)
    add(fmt::format("a timeout of {} ms was asked for, the world's is {} ms",
                    options.timeout->count(), w.timeout.count()));
  if (w.backend == "nccl" && options.device_index >= 0 && device_index != w.device_index)
    add(fmt::format("NCCL device {} was asked for, the world's is {}", device_index,
                    w.device_index));
  if (!differs.empty())
    throw CommError(
        "init_distributed: this process already joined a world that does not fit this call (" +
        differs +
        "); call dscpp::comm::destroy_process_group() on every rank first to join "
        "anew");
}

}  // namespace

bool is_initialized() {
  std::lock_guard<std::mutex> lock(world_mutex());
  return joined().group != nullptr;
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(world_mutex());
  joined() = JoinedWorld{};
}

std::chrono::milliseconds resolve_timeout(const InitOptions& options, const DistEnv& env) {
  if (options.timeout) {
    if (options.timeout->count() <= 0)
      throw CommError(fmt::format("init_distributed: timeout must be positive, got {} ms",
                                  options.timeout->count()));
    return *options.timeout;
  }
  if (env.timeout) return *env.timeout;
  return kDefaultTimeout;
}

std::shared_ptr<ProcessGroup> init_distributed(const InitOptions& options) {
  DistEnv e = read_dist_env();
  const std::chrono::milliseconds timeout = resolve_timeout(options, e);
  std::string kind = options.backend;
  if (kind == "auto") kind = cuda_visible() ? "nccl" : "gloo";
  if (kind != "gloo" && kind != "nccl")
    throw CommError(fmt::format("unknown backend '{}': expected gloo, nccl or auto", kind));
  const int device_index = options.device_index >= 0 ? options.device_index : e.local_rank;
  std::lock_guard<std::mutex> lock(world_mutex());
  JoinedWorld& world = joined();
  if (world.group) {
    check_compatible(world, options, e, kind, device_index);
    return world.group;
  }

  c10::intrusive_ptr<c10d::Store> store;
  if (e.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(e.master_port);
    so.isServer = e.rank == 0;
    so.numWorkers = e.world_size;
    so.waitWorkers = true;
    so.timeout = timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, so);
    } catch (const std::exception& ex) {
      if (e.rank == 0)
        throw CommError(
            fmt::format("rank 0 of {} could not serve the store on port {} (is another job using "
                        "--master_port {}?): {}",
                        e.world_size, e.master_port, e.master_port, error_text(ex)));
      throw CommError(fmt::format("rank {} of {} could not reach the store at {} port {}{}: {}",
                                  e.rank, e.world_size, e.master_addr, e.master_port,
                                  lost_server_hint(ex, e), error_text(ex)));
    }
    try {
      check_same_job(*store, e);
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& ex) {
      throw CommError(fmt::format(
          "rank {} of {} could not read the job id from the store at {} port {}{}: {}", e.rank,
          e.world_size, e.master_addr, e.master_port, lost_server_hint(ex, e), error_text(ex)));
    }
  }
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world/", store);
  std::shared_ptr<BackendHandle> handle;
  try {
    handle = kind == "nccl"
                 ? make_nccl_backend(world_store, e.rank, e.world_size, timeout, device_index)
                 : make_gloo_backend(world_store, e.rank, e.world_size, timeout, e.master_addr,
                                     e.gloo_socket_ifname);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& ex) {
    throw CommError(fmt::format("rank {} of {} could not create the {} group: {}", e.rank,
                                e.world_size, kind, error_text(ex)));
  }
  std::vector<int> ranks(e.world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  world.group = std::make_shared<ProcessGroup>(handle, "world", ranks, timeout);
  // The joined world is a static made before the backend started CUDA, so its destructor
  // would run after CUDA's own teardown, and NCCL's shutdown then aborts the process
  // ("driver shutting down"). Released at exit by a handler registered now, after CUDA
  // started: handlers run in reverse order, so this one runs while CUDA is still there.
  static std::once_flag release_at_exit;
  std::call_once(release_at_exit, [] {
    std::atexit([] {
      std::lock_guard<std::mutex> lock(world_mutex());
      joined() = JoinedWorld{};
    });
  });
  world.env = e;
  world.backend = kind;
  world.timeout = timeout;
  world.device_index = device_index;
  return world.group;
}

}  // namespace dscpp::comm
