// The one way a test skips for want of GPUs, saying why.
// - DSCPP_SKIP_WITHOUT_CUDA(): a GoogleTest test of a GPU path, on a machine without a GPU.
// - exit_if_ranks_would_share_a_gpu(): a multi-rank program of the CUDA build, started by the
//   launcher with more ranks per node than the node has GPUs (NCCL refuses two ranks on one
//   device); every rank exits with kSkipExitCode, which the launcher passes on and ctest's
//   SKIP_RETURN_CODE reads. Without any GPU the ranks run on the CPU over Gloo, as in CI.
#pragma once

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace dscpp::test {

constexpr int kSkipExitCode = 77;

inline int gpu_count() {
  return static_cast<int>(at::getNumGPUs());
}

inline void exit_if_ranks_would_share_a_gpu() {
  const char* local_size = std::getenv("LOCAL_SIZE");
  const int ranks = local_size ? std::atoi(local_size) : 1;
  const int gpus = gpu_count();
  if (gpus > 0 && gpus < ranks) {
    const char* rank = std::getenv("RANK");
    if (!rank || std::string(rank) == "0")
      std::printf("skipped: %d ranks per node need %d GPUs, this machine has %d\n", ranks, ranks,
                  gpus);
    std::exit(kSkipExitCode);
  }
}

}  // namespace dscpp::test

#define DSCPP_SKIP_WITHOUT_CUDA()            \
  do {                                       \
    if (dscpp::test::gpu_count() == 0) {     \
      GTEST_SKIP() << "no CUDA device here"; \
    }                                        \
  } while (0)
