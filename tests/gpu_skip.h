// How a test skips for want of GPUs, saying why.
// - DSCPP_SKIP_WITHOUT_CUDA(): a GoogleTest test of a GPU path, on a machine without a GPU.
// - A multi-rank test needs nothing here: the launcher refuses more ranks per node than the
//   node has GPUs, before starting any, and tests/CMakeLists.txt marks every test whose output
//   carries that refusal as skipped. Without any GPU the ranks run on the CPU over Gloo.
#pragma once

#include <ATen/Context.h>
#include <gtest/gtest.h>

namespace dscpp::test {

inline int gpu_count() {
  return static_cast<int>(at::getNumGPUs());
}

}  // namespace dscpp::test

#define DSCPP_SKIP_WITHOUT_CUDA()            \
  do {                                       \
    if (dscpp::test::gpu_count() == 0) {     \
      GTEST_SKIP() << "no CUDA device here"; \
    }                                        \
  } while (0)
