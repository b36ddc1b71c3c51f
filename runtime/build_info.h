// What this build of dscpp holds and what the machine offers it, for `dscpp_report`
// (DeepSpeed's ds_report): versions of LibTorch, CUDA, NCCL and Gloo, the devices seen.
#pragma once

#include <nlohmann/json_fwd.hpp>

namespace dscpp {

// A JSON object: {"dscpp": ..., "libtorch": ..., "cuda_build": bool, "gloo": ...,
// "cuda": {runtime, driver, devices[]}, "nccl": ...}.
nlohmann::json environment_report();

}  // namespace dscpp
