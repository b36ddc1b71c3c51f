// The CUDA half of environment_report: runtime and driver versions, NCCL's version, and
// every visible device. A machine without a GPU reports zero devices, never an error.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <nlohmann/json.hpp>

namespace dscpp {

nlohmann::json cuda_report() {
  nlohmann::json cuda = {{"build_runtime", CUDART_VERSION}};
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cuda["runtime"] = runtime;
  cuda["driver"] = cudaDriverGetVersion(&driver) == cudaSuccess ? nlohmann::json(driver) : nullptr;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cuda["error"] = cudaGetErrorString(err);
    count = 0;
  }
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    devices.push_back(
        {{"index", i},
         {"name", p.name},
         {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
         {"memory_gib", static_cast<double>(p.totalGlobalMem) / (1 << 30)},
         {"multiprocessors", p.multiProcessorCount}});
  }
  cuda["devices"] = devices;
  int nccl = 0;
  nlohmann::json out = {{"cuda", cuda}};
  if (ncclGetVersion(&nccl) == ncclSuccess)
    out["nccl"] = std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." +
                  std::to_string(nccl % 100);
  return out;
}

}  // namespace dscpp
