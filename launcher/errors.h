// Errors the user can act on (bad flags, bad hostfile, unknown hosts, missing program).
// main() prints them as `dscpp: error: <what>` and exits 2, like argparse-based DeepSpeed
// does for usage errors; anything else is an internal failure and exits 1.
#pragma once

#include <stdexcept>

namespace dscpp::launcher {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dscpp::launcher
