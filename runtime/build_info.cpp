// environment_report for every build; the CUDA part lives in build_info_cuda.cpp.
#include "dscpp/runtime/build_info.h"

#include <torch/version.h>

#include <nlohmann/json.hpp>
#include <thread>

namespace dscpp {

#ifdef DSCPP_CUDA
nlohmann::json cuda_report();  // build_info_cuda.cpp
#endif

nlohmann::json environment_report() {
  nlohmann::json r = {
      {"dscpp", DSCPP_VERSION},
      {"libtorch", TORCH_VERSION},
      {"libtorch_built_for", DSCPP_TORCH_VERSION},
      {"gloo", "compiled in (c10d ProcessGroupGloo)"},
      {"cpu_threads", std::thread::hardware_concurrency()},
  };
#ifdef DSCPP_CUDA
  r["cuda_build"] = true;
  r.update(cuda_report());
#else
  r["cuda_build"] = false;
  r["nccl"] = "not compiled in (CPU build)";
  r["cuda"] = "not compiled in (CPU build)";
#endif
  return r;
}

}  // namespace dscpp
