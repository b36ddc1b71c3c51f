// What the CUDA benchmarks share: the CUDA error check (ops'), the integer flag parser, and the
// main() that reports a failure as "<name>: <what>" with exit status 1.
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <stdexcept>

#include "dscpp/ops/cuda_check.h"

namespace dscpp::bench {

// A flag's value: a non-negative integer (decimal, or 0x / 0 prefixed).
inline int64_t parse_int(const char* s, const char* flag) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 0);
  if (end == s || *end != '\0' || v < 0)
    throw std::invalid_argument(fmt::format("{}: '{}' is not a non-negative integer", flag, s));
  return v;
}

template <typename Run>
int main_of(const char* name, Run run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", name, e.what());
    return 1;
  }
}

}  // namespace dscpp::bench

// CUDA_CHECK: the library's one CUDA error check (ops/cuda_check.h).
#define CUDA_CHECK(call) DSCPP_CUDA_CHECK(call)
