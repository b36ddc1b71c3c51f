// The one CUDA error check: a failed runtime call throws, naming the call, CUDA's error and
// the file and line. Host code only (no device code), so kernels, their wrappers and the
// benchmarks share it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "dscpp/error.h"

namespace dscpp::ops::cuda {

inline void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess)
    throw Error(std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace dscpp::ops::cuda

#define DSCPP_CUDA_CHECK(call) ::dscpp::ops::cuda::check((call), #call, __FILE__, __LINE__)
