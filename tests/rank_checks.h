// The per-rank checks of the multi-rank tests that run as plain programs under the launcher
// (not gtest): each failed check prints what failed on this rank and counts; main returns
// nonzero when any did. Shared by tests/runtime/engine/tp_common.h and tests/moe_test_util.h,
// so that one counter sees every check a test makes. Header-only, test code.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>

namespace rank_checks {

// Failed checks of this rank.
inline int failures = 0;
inline void check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::cerr << "rank " << rank << ": FAILED: " << what << "\n";
    ++failures;
  }
}

// got within 1e-5 relative of want (fp32 arithmetic in another order); the message names both.
inline void check_close(double got, double want, const std::string& what, int rank) {
  check(std::abs(got - want) <= 1e-5 * std::abs(want),
        what + " " + std::to_string(got) + " vs " + std::to_string(want), rank);
}

// The largest elementwise difference relative to the largest magnitude of want.
inline double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kDouble), w = want.detach().to(at::kDouble);
  return (g - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-30);
}

}  // namespace rank_checks
