// CheckpointError: what every checkpoint reader and writer throws (a dscpp::Error), saying
// which file or folder is wrong, where in it (a byte offset, a key) and how.
#pragma once

#include "dscpp/error.h"

namespace dscpp::checkpoint {

class CheckpointError : public dscpp::Error {
 public:
  using dscpp::Error::Error;
};

}  // namespace dscpp::checkpoint
